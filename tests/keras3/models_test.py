"""BERT, ALBERT, T5 and the decoder-only LMs in Keras 3 hold the tf_keras
models' weights.

For each preset family, with multi-head and talking-heads attention (and
the gated, differential and DCMHA variants in two of them), a
tf_keras model (thattn.models) with random weights is run here; each Keras
3 backend (`models_checks.py`, a process per backend) builds the same
preset with thattn.keras3.models, takes those weights by `set_weights` and
must give the same outputs (<= 1e-5 of the largest output, float32); and
the Keras 3 models' own random weights, set into the tf_keras model, give
the Keras 3 outputs back. The weights a run draws from its seed
(`initial_weights.assign` on each front end) are the same on both.
"""

import re

import numpy as np
import pytest

from tests.keras3 import processes
from tests.keras3.models_checks import DRAW_SEED
from tests.keras3.models_checks import normalized_name

CASES = {f"{preset}-{attention}": (preset, attention)
         for preset in ("bert_tiny", "albert_tiny", "t5_tiny", "lm_tiny")
         for attention in ("multi_head", "talking_heads")}
# The other decoder-only shapes: learned positions, and the parallel
# residual with partial rotation.
CASES.update({"gpt2_tiny-multi_head": ("gpt2_tiny", "multi_head"),
              "pythia_tiny-talking_heads": ("pythia_tiny", "talking_heads")})
# The gated attention variants (an output gate, element-wise, and head-wise
# with BERT's biases, made last on both fronts) and differential attention
# (lambda_init by each block's depth), and DCMHA (its dynamic kernels and
# per-key compose).
CASES.update({"lm_tiny-gated": ("lm_tiny", "gated"),
              "bert_tiny-gated_headwise": ("bert_tiny", "gated_headwise"),
              "lm_tiny-differential": ("lm_tiny", "differential"),
              "lm_tiny-dcmha": ("lm_tiny", "dcmha")})


def _inputs(preset, rng):
  if preset in ("lm_tiny", "gpt2_tiny", "pythia_tiny"):
    return {"decoder_input_tokens":
                rng.integers(0, 128, size=(2, 7)).astype("int32")}
  if preset.startswith("t5"):
    encoder = rng.integers(2, 64, size=(2, 7)).astype("int32")
    encoder[1, 5:] = 0  # padding
    decoder = rng.integers(2, 64, size=(2, 5)).astype("int32")
    decoder[:, 0] = 0  # the start token
    return {"encoder_input_tokens": encoder, "decoder_input_tokens": decoder}
  ids = rng.integers(1, 128, size=(2, 6)).astype("int32")
  mask = np.ones((2, 6), "int32")
  mask[1, 4:] = 0
  types = (np.arange(6)[None, :] >= 3).astype("int32").repeat(2, axis=0)
  return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def _outputs(model, inputs):
  outputs = model(inputs, training=False)
  if isinstance(outputs, dict):
    return {key: value.numpy() for key, value in outputs.items()}
  return {"logits": outputs.numpy()}


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
  """tf_keras models with random weights, their inputs and outputs."""
  from thattn import models  # pylint: disable=g-import-not-at-top
  from thattn.models import initial_weights  # pylint: disable=g-import-not-at-top
  folder = tmp_path_factory.mktemp("keras3_models")
  rng = np.random.default_rng(0)
  built = {}
  for case, (preset, attention) in CASES.items():
    model = models.create_model(preset, attention=attention)
    weights = [rng.normal(size=w.shape).astype("float32") * 0.2
               for w in model.weights]
    model.set_weights(weights)
    inputs = _inputs(preset, rng)
    drawn = models.create_model(preset, attention=attention)
    initial_weights.assign([drawn], seed=DRAW_SEED)
    np.savez(folder / f"{case}.tf_keras.npz", preset=preset,
             attention=attention,
             names=np.array([w.name for w in model.weights]),
             **{f"weight_{index}": w for index, w in enumerate(weights)},
             **{f"drawn_{index}": w.numpy()
                for index, w in enumerate(drawn.weights)},
             **{f"input_{key}": value for key, value in inputs.items()},
             **{f"output_{key}": value
                for key, value in _outputs(model, inputs).items()})
    built[case] = (model, inputs)
  return folder, built


@pytest.mark.parametrize("backend", processes.BACKENDS)
def test_weights_move_both_ways_with_equal_outputs(backend, exchange):
  processes.require(backend)
  folder, built = exchange
  output = processes.run_pytest(backend, "models_checks.py",
                                THATTN_MODELS_EXCHANGE=str(folder))
  # Each case: the exchange of weights, and the seeded draw.
  assert re.search(rf"{2 * len(CASES)} passed", output), output
  for case, (model, inputs) in built.items():
    saved = np.load(folder / f"{case}.{backend}.npz")
    model.set_weights([saved[f"weight_{index}"]
                       for index in range(len(model.weights))])
    for key, value in _outputs(model, inputs).items():
      want = saved[f"output_{key}"]
      np.testing.assert_allclose(value, want, rtol=0,
                                 atol=1e-5 * np.abs(want).max(),
                                 err_msg=f"{backend} {case}: {key}")


def test_names_are_compared_without_tf_keras_s_doubled_scope():
  assert normalized_name("block_0/attention/attention/query/kernel:0") == (
      "block_0/attention/query/kernel")
  assert normalized_name("pooler/dense/kernel") == "pooler/dense/kernel"


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_keras3_models_import_no_tensorflow(backend):
  processes.require(backend)
  output = processes.run(backend, ["-c", (
      "import sys\n"
      "from thattn.keras3 import models\n"
      "models.create_model('t5_tiny', attention='talking_heads')\n"
      "print(sorted(m for m in ('tensorflow', 'tf_keras', 'mesh_tensorflow',"
      " 'tensorflow_text') if m in sys.modules))")])
  assert output.strip().splitlines()[-1] == "[]", output
