"""DCPythia and DCFormer hub folders into thattn's DCMHA decoder LM,
against the DCFormer authors' own code.

The folders in dcformer_folders/ are tiny models that the authors'
`modeling_dcpythia.py` and `modeling_dcformer.py` (the May-2024 version,
DCFormer-2.8B's) built and saved as their hub folders are laid out, with
those models' logits and greedy continuations: write_folders.py made them
(the authors' code cannot be installed, so they are checked in). Each has
a local first layer whose window (3: 4 keys in the released prefill) is
shorter than the 10 tokens, q/k norms, and every weight drawn at random.
thattn's model, converted with `thattn-convert --source`'s map, gives
their logits within 1e-5 of their scale and their greedy tokens with its
caches; what it cannot represent is refused by name. On Keras 3:
tests/keras3/hugging_face_checks.py.
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
from thattn.io import hugging_face_files
from thattn.models import hugging_face_decoders

torch = pytest.importorskip("torch")

FOLDERS = pathlib.Path(__file__).parent / "dcformer_folders"
FAMILIES = ("dcpythia", "dcformer")


def _converted(folder, attention="dcmha"):
  read = hugging_face_decoders.read(str(folder), attention)
  model = models.create_model(read.config)
  weight_maps.assign(model, weight_maps.plan(
      model, read.arrays, read.rules, dropped=read.dropped,
      source=str(folder)))
  return read.config, model


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_greedy_tokens_equal_the_authors(family):
  expected = np.load(FOLDERS / family / "expected.npz")
  config, model = _converted(FOLDERS / family)
  assert (config.sliding_window, config.window_pattern) == (4, "LG")
  assert config.query_key_epsilon == 1e-6
  logits = model({"decoder_input_tokens": tf.constant(expected["tokens"])})
  want = expected["logits"]
  np.testing.assert_allclose(logits.numpy(), want, rtol=0,
                             atol=1e-5 * np.abs(want).max())
  prompt, greedy = expected["prompt"], expected["greedy"]
  continuation = models.generate(
      model, prompt, max_length=greedy.shape[1] - prompt.shape[1])
  np.testing.assert_array_equal(continuation["tokens"].numpy(),
                                greedy[:, prompt.shape[1]:])


def test_the_blocks_are_pythia_s_and_llama_s():
  pythia, _ = _converted(FOLDERS / "dcpythia")
  dcformer, _ = _converted(FOLDERS / "dcformer")
  fields = ("norm", "activation", "gated_feed_forward", "parallel_residual",
            "use_bias", "rotary_pct", "layer_norm_epsilon")
  assert [getattr(pythia, name) for name in fields] == [
      "layer_norm", "gelu", False, True, True, 0.5, 1e-5]
  assert [getattr(dcformer, name) for name in fields] == [
      "rms_norm", "silu", True, False, False, 1.0, 1e-6]


@pytest.mark.parametrize("family", FAMILIES)
def test_thattn_convert_writes_a_model_dir_with_the_authors_logits(
    family, tmp_path):
  out = tmp_path / "converted"
  config = converters.convert(source=str(FOLDERS / family),
                              model_dir=str(out), log=lambda line: None)
  assert config.attention.variant == "dcmha"
  run_config = json.loads((out / "run_config.json").read_text())
  assert run_config["converted_from"]["attention"] == "dcmha"
  assert run_config["preset"] == f"{family}_" + (
      "6p9b" if family == "dcpythia" else "2p8b")
  expected = np.load(FOLDERS / family / "expected.npz")
  logits = models.load(str(out))(
      {"decoder_input_tokens": tf.constant(expected["tokens"])}).numpy()
  np.testing.assert_allclose(logits, expected["logits"], rtol=0,
                             atol=1e-5 * np.abs(expected["logits"]).max())
  with pytest.raises(ValueError, match="holds dcmha attention, which "
                                       "converts only as itself"):
    converters.convert(source=str(FOLDERS / family),
                       model_dir=str(tmp_path / "th"),
                       attention="talking_heads")
  assert not (tmp_path / "th").exists()


def test_a_sharded_folder_reads_as_the_whole(tmp_path):
  """The released folders shard `pytorch_model-0000k-of-0000n.bin` under
  `pytorch_model.bin.index.json`."""
  state = torch.load(FOLDERS / "dcpythia" / "pytorch_model.bin",
                     weights_only=True)
  names = sorted(state)
  shards = {"pytorch_model-00001-of-00002.bin": names[:10],
            "pytorch_model-00002-of-00002.bin": names[10:]}
  for file_name, shard in shards.items():
    torch.save({name: state[name] for name in shard}, tmp_path / file_name)
  (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(
      {"weight_map": {name: file_name for file_name, shard in shards.items()
                      for name in shard}}))
  shutil.copy(FOLDERS / "dcpythia" / "config.json", tmp_path)
  whole = hugging_face_files.read_arrays(str(FOLDERS / "dcpythia"))
  sharded = hugging_face_files.read_arrays(str(tmp_path))
  assert sorted(sharded) == sorted(whole)
  for name, value in whole.items():
    np.testing.assert_array_equal(sharded[name], value)


@pytest.mark.parametrize("change, message", [
    (dict(use_dcmha=False), "use_dcmha=False"),
    (dict(query_wise=True), "query_wise=True"),
    (dict(window_type="LLG"), "window_type='LLG'"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings=True"),
])
def test_what_thattn_cannot_represent_is_refused_by_name(change, message,
                                                         tmp_path):
  shutil.copytree(FOLDERS / "dcpythia", tmp_path / "folder")
  config = json.loads((tmp_path / "folder" / "config.json").read_text())
  (tmp_path / "folder" / "config.json").write_text(
      json.dumps(dict(config, **change)))
  with pytest.raises(ValueError, match=message):
    hugging_face_decoders.read(str(tmp_path / "folder"), "dcmha")
  with pytest.raises(ValueError, match="represents only dcpythia's DCMHA"):
    hugging_face_decoders.read(str(FOLDERS / "dcpythia"), "multi_head")


def test_a_static_mix_other_than_the_identity_is_refused(tmp_path):
  shutil.copytree(FOLDERS / "dcformer", tmp_path / "folder")
  state = torch.load(tmp_path / "folder" / "pytorch_model.bin",
                     weights_only=True)
  state["layers.1.attention.dyn_w_proj.post_proj.w"] *= 2.0
  torch.save(state, tmp_path / "folder" / "pytorch_model.bin")
  with pytest.raises(ValueError, match=r"layers\.1\.attention\.dyn_w_proj\."
                                       r"post_proj\.w is not the identity"):
    hugging_face_decoders.read(str(tmp_path / "folder"), "dcmha")
