"""thattn-convert of a Hugging Face GPT-2 folder with its byte-level BPE
tokenizer, and fine-tuning from it on both backends.

The source is a tiny GPT2LMHeadModel with a byte-level BPE tokenizer that
Hugging Face `tokenizers` learned from the docs/examples texts, both saved
with `save_pretrained` (config.json, model.safetensors, tokenizer.json).
The converted model_dir (talking heads at the identity) tokenizes as
transformers' tokenizer does, runs of spaces included; its backbone gives
transformers' logits; `--task=causal_lm --init_checkpoint` fine-tunes it
with the source's tokenizer on `--backend=keras` and `--backend=keras3`;
its export serves token ids (a byte-level BPE runs in Python, which a
SavedModel cannot hold). What thattn cannot represent is refused, nothing
written.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers

from tests import cli
from tests.converters import checks
from tests.keras3 import processes
from thattn import models
from thattn.data import tokenizers

_ENV = processes.train_environment()
_PROBES = ["A list holds items.", "Two  spaces,   three, and a tab\there.",
           "  leading and trailing  ", "Ünïcödé and 🙂 bytes", "don't  'll"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """(the transformers model, its tokenizer, the saved folder)."""
  hf_tokenizers = pytest.importorskip("tokenizers")
  bpe = hf_tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(checks.sample_texts(), vocab_size=400,
                          min_frequency=2,
                          special_tokens=["<|endoftext|>"])
  tokenizer = transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe._tokenizer,  # pylint: disable=protected-access
      eos_token="<|endoftext|>", bos_token="<|endoftext|>")
  end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2,
      n_head=4, bos_token_id=end, eos_token_id=end)).eval()
  with torch.no_grad():
    for name, weight in model.named_parameters():
      weight.normal_(0.0, 0.05 if name.endswith("bias") else 0.3)
  folder = tmp_path_factory.mktemp("hf_lm") / "gpt2"
  model.save_pretrained(folder)
  tokenizer.save_pretrained(folder)
  return model, tokenizer, folder


@pytest.fixture(scope="module")
def converted(source, tmp_path_factory):
  _, _, folder = source
  model_dir = tmp_path_factory.mktemp("converted") / "gpt2_th"
  cli.run_ok(cli.command("convert", f"--source={folder}",
                         f"--model_dir={model_dir}",
                         "--attention=talking_heads"), _ENV)
  return model_dir


def test_the_model_dir_is_a_causal_lm_with_the_sources_tokenizer(
    source, converted):
  _, reference, _ = source
  config = json.loads((converted / "run_config.json").read_text())
  assert (config["task"], config["preset"]) == ("causal_lm", "gpt2")
  assert config["converted_from"]["format"] == "hugging_face_lm"
  tokenizer = tokenizers.load(str(converted / "tokenizer"))
  assert config["eos_id"] == tokenizer.special.eos == reference.eos_token_id
  got = tokenizer.tokenize(tf.constant(_PROBES)).to_list()
  want = [reference(text, add_special_tokens=False)["input_ids"]
          for text in _PROBES]
  assert got == want
  texts = tokenizer.detokenize(tf.ragged.constant(want)).numpy()
  assert [text.decode("utf-8") for text in texts] == _PROBES


def test_the_backbone_gives_transformers_logits(source, converted):
  model, _, _ = source
  tokens = np.random.default_rng(0).integers(0, 300, size=(2, 9),
                                             dtype=np.int32)
  with torch.no_grad():
    want = model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
  backbone = models.load(str(converted))
  got = backbone({"decoder_input_tokens": tf.constant(tokens)}).numpy()
  np.testing.assert_allclose(got, want, rtol=0,
                             atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("backend", ["keras", "keras3"])
def test_fine_tuning_takes_the_checkpoint_and_its_tokenizer(
    converted, backend, tmp_path):
  text = tmp_path / "train.txt"
  text.write_text("\n\n".join(checks.sample_texts()))
  run = tmp_path / "run"
  stdout = cli.run_ok(cli.command(
      "train", f"--model_dir={run}", "--task=causal_lm",
      f"--init_checkpoint={converted}", f"--backend={backend}",
      f"--train_files={text}", "--sequence_length=32", "--batch_size=2",
      "--train_steps=3", "--eval_steps=1", "--warmup_steps=1",
      "--log_every=1", "--learning_rate=0.003",
      *(["--noexport"] if backend == "keras3" else [])), _ENV)
  assert "Tokenizer: the --init_checkpoint run's" in stdout
  assert "Backbone initialized from" in stdout
  summary = json.loads((run / "summary.json").read_text())
  assert np.isfinite(summary["held_out_ln_ppl_after"])
  if backend == "keras":  # the export serves token ids, not text
    served = tf.saved_model.load(str(run / "export"))
    assert "serve_token_ids" in served.signatures
    out = served.signatures["serving_default"](
        prompt_tokens=tf.constant([[5, 9, 14]]))
    assert out["tokens"].shape == (1, 32)


def test_what_thattn_cannot_represent_is_refused_and_nothing_written(
    source, tmp_path):
  _, _, folder = source
  changed = tmp_path / "changed"
  changed.mkdir()
  for name in os.listdir(folder):
    (changed / name).write_bytes((folder / name).read_bytes())
  config = json.loads((changed / "config.json").read_text())
  config["scale_attn_by_inverse_layer_idx"] = True
  (changed / "config.json").write_text(json.dumps(config))
  result = cli.run(cli.command("convert", f"--source={changed}",
                               f"--model_dir={tmp_path / 'out'}"), _ENV)
  assert result.returncode != 0
  assert "scale_attn_by_inverse_layer_idx=True" in result.stderr
  assert not (tmp_path / "out").exists()
