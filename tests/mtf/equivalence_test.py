"""Every attention variant: mtf's layer on PlacementMeshImpl == thattn's.

For each variant (tests/mtf/variants.py) and each of causal
self-attention, bidirectional self-attention and encoder-decoder attention,
all with padding: the mtf layer, lowered on one CPU device, and thattn's
Keras layer holding the converted weights give the same output and the
same gradients with respect to the inputs and every weight, to 1e-5 of the
largest magnitude (float32). The measured differences are printed (run
with -s) and listed in docs/mtf.md.

    .venv/bin/python -m pytest -q -s tests/mtf/equivalence_test.py
"""

import pytest

from thattn.mtf import layer_weights
from thattn.mtf import runner

try:
  from . import variants as v
except ImportError:  # Bazel runs the test as a top-level module
  import variants as v  # pylint: disable=g-import-not-at-top

MODES = {"causal": (False, True), "bidirectional": (False, False),
         "enc_dec": (True, False)}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("variant", list(v.VARIANTS))
def test_mtf_layer_equals_keras_layer_outputs_and_gradients(variant, mode):
  enc_dec, causal = MODES[mode]
  layer = v.VARIANTS[variant](enc_dec)
  data = v.inputs()
  result = runner.run_layer(
      layer, query=data["query"], cotangent=data["cotangent"],
      memory=data["memory"] if enc_dec else None, causal=causal,
      query_segments=data["query_segments"],
      memory_segments=data["memory_segments"] if enc_dec else None)
  # The converter's idea of the variables is mtf's, name for name.
  assert result.variable_dims == layer_weights.mtf_variable_dims(
      layer=layer, d_model=v.WIDTH)
  keras = v.keras_twin(layer, enc_dec=enc_dec, causal=causal,
                       mtf_variables=result.variables)
  output, input_grads, weight_grads = v.run_keras(keras, data,
                                                  enc_dec=enc_dec,
                                                  causal=causal)
  errors = {"output": v.relative_error(output, result.output)}
  for name, grad in result.input_grads.items():
    errors[f"d/d{name}"] = v.relative_error(input_grads[name], grad)
  # Gradients have their variable's shape, so the weight map converts them.
  mtf_grads = layer_weights.mtf_to_keras(layer=layer, d_model=v.WIDTH,
                                   variables=result.variable_grads)
  assert set(mtf_grads) == set(weight_grads)
  for token, grad in mtf_grads.items():
    errors[f"d/d{token}"] = v.relative_error(weight_grads[token], grad)
  print(f"\n{variant}/{mode}: max relative difference "
        f"{max(errors.values()):.1e} ({max(errors, key=errors.get)})")
  assert max(errors.values()) <= v.TOLERANCE, errors
