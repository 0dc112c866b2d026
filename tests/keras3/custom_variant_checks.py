"""A variant registered outside thattn (docs/examples/custom_variant.py) on
one Keras 3 backend: its layer against the NumPy reference, in a model,
and through a .keras file. Run by `backends_test.py` in a process per
backend, not collected on its own."""

import keras
from keras import ops
import numpy as np
import pytest

from tests.layers import custom_variant_reference as example
from tests.layers import numpy_reference as ref
from thattn import keras3

example.import_example()


def _set_by_name(layer, weights):
  layer.set_weights([weights[v.path.split("/", 1)[1]].astype("float32")
                     for v in layer.weights])


@pytest.mark.parametrize("memory", ["self", "cross"])
def test_the_registered_variant_equals_its_reference(memory):
  rng = np.random.default_rng(3)
  self_attention = memory == "self"
  n, m, d_x = 5, 5 if self_attention else 7, 8
  d_m = d_x if self_attention else 6
  x, mem = ref.make_inputs(rng, 2, n, m, d_x, d_m, self_attention)
  layer_mask, causal, ref_mask = ref.make_masks(
      rng, "random_and_causal" if self_attention else "random", 2, n, m)
  layer = keras3.make_attention(example.NAME, 3, 4, value_dim=5)
  assert type(layer).__name__ == "HeadMixingAttention"
  layer(x.astype("float32"), mem.astype("float32"))
  weights = example.random_weights(rng, d_x, d_m, 3, 4, 5, d_x)
  _set_by_name(layer, weights)
  got, scores = layer(x.astype("float32"), mem.astype("float32"),
                      attention_mask=layer_mask, use_causal_mask=causal,
                      return_attention_scores=True)
  want, want_scores = example.reference(x, mem, weights, mask=ref_mask)
  ref.assert_close(np.asarray(ops.convert_to_numpy(got)), want)
  ref.assert_close(np.asarray(ops.convert_to_numpy(scores)), want_scores)


def test_the_registered_variant_builds_a_model_and_saves(tmp_path):
  model = keras3.models.create_model("bert_tiny", attention=example.NAME)
  mixing = [layer for layer in model._flatten_layers()  # pylint: disable=protected-access
            if type(layer).__name__ == "HeadMixingAttention"]
  assert mixing and all(layer.variant == example.NAME for layer in mixing)
  rng = np.random.default_rng(0)
  for layer in mixing:  # move the residuals off zero, so they count
    for variable in layer.variant_weights.values():
      variable.assign(rng.normal(size=variable.shape).astype("float32"))
  ids = np.array([[5, 6, 7, 8], [9, 10, 11, 0]], "int32")
  inputs = {"input_word_ids": ids, "input_mask": (ids > 0).astype("int32"),
            "input_type_ids": np.zeros_like(ids)}
  want = ops.convert_to_numpy(model(inputs)["sequence_output"])
  path = str(tmp_path / "custom.keras")
  model.save(path)
  loaded = keras.saving.load_model(path)
  np.testing.assert_allclose(
      ops.convert_to_numpy(loaded(inputs)["sequence_output"]), want,
      rtol=1e-5, atol=1e-5)
