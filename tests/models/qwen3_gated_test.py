"""Qwen3 folders of the gated-attention paper's own code (Qiu et al., 2025;
qiuzh20/gated_attention) into thattn's gated decoder LM, against that
code.

The folders in gated_attention_folders/ are tiny Qwen3 models, one with a
head-wise and one with an element-wise gate over shared key and value
heads, that the paper's `modeling_qwen3.py` built and saved
(write_folders.py; the code needs transformers 4, so the folders are
checked in). Their q_proj holds each key-value group's queries, then its
gates. thattn's model gives their logits within 1e-5 of their scale and
their greedy tokens with its caches, as `gated_headwise` and `gated`
(the folder's own), through `thattn-convert` too. transformers' own
Qwen3 (no gate): tests/models/hugging_face_decoders_test.py.
"""

import json
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

from thattn import converters
from thattn import models
from thattn.core import weight_maps
from thattn.models import hugging_face_decoders

FOLDERS = pathlib.Path(__file__).parent / "gated_attention_folders"


@pytest.mark.parametrize("folder, variant", [("headwise", "gated_headwise"),
                                             ("elementwise", "gated")])
def test_logits_and_greedy_tokens_equal_the_papers_code(folder, variant):
  path = str(FOLDERS / folder)
  assert hugging_face_decoders.source_attention(path) == variant
  read = hugging_face_decoders.read(path, variant)
  assert (read.config.query_key_norm,
          read.config.attention.num_key_value_heads) == (True, 2)
  model = models.create_model(read.config)
  weight_maps.assign(model, weight_maps.plan(
      model, read.arrays, read.rules, dropped=read.dropped, source=path))
  expected = np.load(FOLDERS / folder / "expected.npz")
  logits = model({"decoder_input_tokens": tf.constant(expected["tokens"])})
  want = expected["logits"]
  np.testing.assert_allclose(logits.numpy(), want, rtol=0,
                             atol=1e-5 * np.abs(want).max())
  prompt, greedy = expected["prompt"], expected["greedy"]
  continuation = models.generate(
      model, prompt, max_length=greedy.shape[1] - prompt.shape[1])
  np.testing.assert_array_equal(continuation["tokens"].numpy(),
                                greedy[:, prompt.shape[1]:])


def test_thattn_convert_takes_the_folder_as_its_own_gate(tmp_path):
  config = converters.convert(source=str(FOLDERS / "headwise"),
                              model_dir=str(tmp_path / "converted"),
                              log=lambda line: None)
  assert config.attention.variant == "gated_headwise"
  with pytest.raises(ValueError, match="holds gated_headwise attention, "
                                       "which converts only as itself"):
    converters.convert(source=str(FOLDERS / "headwise"),
                       model_dir=str(tmp_path / "th"), attention="gated")
  assert not (tmp_path / "th").exists()


@pytest.mark.parametrize("change, message", [
    (dict(elementwise_attn_output_gate=True),
     "headwise_attn_output_gate and elementwise_attn_output_gate=True"),
    (dict(use_sliding_window=True), "use_sliding_window=True"),
    (dict(qkv_bias=True), "attention_bias=True"),
])
def test_what_thattn_cannot_represent_is_refused_by_name(change, message,
                                                         tmp_path):
  shutil.copytree(FOLDERS / "headwise", tmp_path / "folder")
  config_file = tmp_path / "folder" / "config.json"
  config_file.write_text(json.dumps(dict(json.loads(config_file.read_text()),
                                         **change)))
  with pytest.raises(ValueError, match=message):
    hugging_face_decoders.read(str(tmp_path / "folder"), "gated_headwise")
