"""Hugging Face folders straight into Keras 3 on one backend, without
TensorFlow.

Run by `hugging_face_test.py` in a process per backend (JAX, PyTorch),
with THATTN_HF_EXCHANGE naming a folder where the parent left tiny GPT-2,
Llama and GPT-NeoX folders that transformers saved (`<family>/`) and
transformers' logits and greedy continuation for them
(`<family>.npz`; DiffLlama's and Qwen3-Next's `<family>.held.npz`: they
load as their own differential and gated attention), and tiny BERT and
ALBERT folders with their encoder outputs (`<family>.encoder.npz`). Each check loads a folder with
`thattn.keras3.models.load`, as multi-head attention and upgraded to
talking heads at the identity: transformers' logits within 1e-5 of their
scale, and its greedy tokens; and nothing here imports TensorFlow.
"""

import os
import pathlib
import sys

from keras import ops
import numpy as np
import pytest

from thattn.keras3 import models

EXCHANGE = pathlib.Path(os.environ.get("THATTN_HF_EXCHANGE", "."))


def families():
  """The decoder-only LMs' folders (`<family>.npz`)."""
  return sorted(path.stem for path in EXCHANGE.glob("*.npz")
                if "." not in path.stem)


def held_families():
  """The folders of another variant than multi-head
  (`<family>.held.npz`: DiffLlama, Qwen3-Next, DCPythia, DCFormer, the
  gated-attention paper's Qwen3)."""
  return sorted(path.name.split(".")[0]
                for path in EXCHANGE.glob("*.held.npz"))


def encoders():
  """The BERT and ALBERT folders (`<family>.encoder.npz`)."""
  return sorted(path.name.split(".")[0]
                for path in EXCHANGE.glob("*.encoder.npz"))


@pytest.mark.parametrize("attention", ["multi_head", "talking_heads"])
@pytest.mark.parametrize("family", families())
def test_a_folder_loads_with_transformers_logits(family, attention):
  saved = np.load(EXCHANGE / f"{family}.npz")
  model = models.load(str(EXCHANGE / family), attention=attention)
  logits = ops.convert_to_numpy(
      model({"decoder_input_tokens": saved["tokens"]}))
  want = saved["logits"]
  np.testing.assert_allclose(logits, want, rtol=0,
                             atol=1e-5 * np.abs(want).max())
  continuation = models.generate(model, saved["prompt"],
                                 max_length=saved["greedy"].shape[1])
  np.testing.assert_array_equal(
      ops.convert_to_numpy(continuation["tokens"]), saved["greedy"])


@pytest.mark.parametrize("family", held_families())
def test_a_folder_of_another_variant_loads_as_itself(family):
  """DiffLlama's folder as differential attention, Qwen3-Next's as gated
  attention, DCPythia's and DCFormer's as DCMHA, the gated-attention
  paper's Qwen3 as its gate (no `attention`: the folder's own), with their sources' logits and greedy tokens; upgrading
  them to another variant is refused."""
  saved = np.load(EXCHANGE / f"{family}.held.npz")
  model = models.load(str(EXCHANGE / family))
  logits = ops.convert_to_numpy(
      model({"decoder_input_tokens": saved["tokens"]}))
  want = saved["logits"]
  np.testing.assert_allclose(logits, want, rtol=0,
                             atol=1e-5 * np.abs(want).max())
  continuation = models.generate(model, saved["prompt"],
                                 max_length=saved["greedy"].shape[1])
  np.testing.assert_array_equal(
      ops.convert_to_numpy(continuation["tokens"]), saved["greedy"])
  with pytest.raises(ValueError, match="converts only as itself"):
    models.load(str(EXCHANGE / family), attention="talking_heads")


@pytest.mark.parametrize("attention", ["multi_head", "talking_heads"])
@pytest.mark.parametrize("family", encoders())
def test_an_encoder_folder_loads_with_transformers_outputs(family,
                                                          attention):
  saved = np.load(EXCHANGE / f"{family}.encoder.npz")
  model = models.load(str(EXCHANGE / family), attention=attention)
  outputs = model({name: saved[name] for name in
                   ("input_word_ids", "input_mask", "input_type_ids")})
  for name in ("sequence_output", "pooled_output"):
    np.testing.assert_allclose(ops.convert_to_numpy(outputs[name]),
                               saved[name], rtol=0, atol=1e-5,
                               err_msg=name)


def test_nothing_imported_tensorflow():
  for family in families() + encoders():
    models.load(str(EXCHANGE / family))
  assert not [name for name in ("tensorflow", "tf_keras", "tensorflow_text")
              if name in sys.modules]


def test_a_thattn_variant_without_an_identity_start_is_refused():
  with pytest.raises(ValueError, match="starts only"):
    models.load(str(EXCHANGE / families()[0]), attention="general_bilinear")
