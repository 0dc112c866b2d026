"""`thattn.keras3.models.load` of Hugging Face GPT-2, Llama, GPT-NeoX,
DiffLlama, Qwen3-Next, BERT and ALBERT folders on JAX and PyTorch without TensorFlow
(hugging_face_checks.py, a process per backend), against transformers' own
logits and greedy `generate` for the tiny models
tests/models/hugging_face_decoders_test.py saves, and its encoder outputs
for tiny BERT and ALBERT models saved here; and of the DCPythia and
DCFormer folders the DCFormer authors' code wrote
(tests/models/dcformer_folders) and the Qwen3 folders the gated-attention
paper's code wrote (tests/models/gated_attention_folders), against that
code's logits and greedy tokens."""

import pathlib
import re
import shutil

import numpy as np
import pytest

from tests.converters import checks
from tests.keras3 import processes
from tests.models import hugging_face_decoders_test as sources

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_ENCODER = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=32, type_vocab_size=2)


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
  folder = tmp_path_factory.mktemp("hugging_face_exchange")

  class _Here:  # tmp_path_factory's mktemp, into this one folder
    @staticmethod
    def mktemp(name):
      del name
      return folder

  # `<family>.npz` for multi-head sources, `<family>.held.npz` for the
  # others (DiffLlama), which load as their own variant only.
  for family in sorted(sources.SOURCES) + sorted(sources.HELD_SOURCES):
    _, model, _ = sources._saved(family, _Here)  # pylint: disable=protected-access
    tokens = sources._tokens()  # pylint: disable=protected-access
    prompt = tokens[:, :4]
    held = ".held" if family in sources.HELD_SOURCES else ""
    np.savez(folder / f"{family}{held}.npz", tokens=tokens,
             logits=sources._reference_logits(model, tokens),  # pylint: disable=protected-access
             prompt=prompt,
             greedy=sources._reference_continuation(model, prompt, 5))  # pylint: disable=protected-access
  # Folders their methods' authors' code wrote: DCMHA's (they load as
  # dcmha only) and the gated-attention paper's Qwen3 (as their gate).
  here = pathlib.Path(sources.__file__).parent
  for family, written in (
      ("dcpythia", here / "dcformer_folders" / "dcpythia"),
      ("dcformer", here / "dcformer_folders" / "dcformer"),
      ("qwen3_headwise", here / "gated_attention_folders" / "headwise"),
      ("qwen3_elementwise",
       here / "gated_attention_folders" / "elementwise")):
    shutil.copytree(written, folder / family)
    expected = np.load(written / "expected.npz")
    prompt = expected["prompt"]
    np.savez(folder / f"{family}.held.npz", tokens=expected["tokens"],
             logits=expected["logits"], prompt=prompt,
             greedy=expected["greedy"][:, prompt.shape[1]:])
  # BERT and ALBERT: transformers' encoder outputs on a padded batch with
  # both token types (no tokenizer: Keras 3 does not read it).
  torch.manual_seed(0)
  encoders = {
      "bert": transformers.BertModel(transformers.BertConfig(**_ENCODER)),
      "albert": transformers.AlbertModel(transformers.AlbertConfig(
          **_ENCODER, embedding_size=16))}
  batch = checks.padded_batch(_ENCODER["vocab_size"])
  for family, model in encoders.items():
    model.eval().save_pretrained(folder / family)
    with torch.no_grad():
      outputs = model(
          input_ids=torch.tensor(batch["input_word_ids"], dtype=torch.long),
          attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
          token_type_ids=torch.tensor(batch["input_type_ids"],
                                      dtype=torch.long))
    np.savez(folder / f"{family}.encoder.npz", **batch,
             sequence_output=outputs.last_hidden_state.numpy(),
             pooled_output=outputs.pooler_output.numpy())
  return folder


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_folders_load_without_tensorflow_with_transformers_logits(backend,
                                                                  exchange):
  processes.require(backend)
  output = processes.run_pytest(backend, "hugging_face_checks.py",
                                THATTN_HF_EXCHANGE=str(exchange))
  # Three decoder families and two encoder families as two variants,
  # DiffLlama, Qwen3-Next, DCPythia, DCFormer and the gated-attention
  # paper's two Qwen3 as themselves, the imports, the refusals.
  assert re.search(r"\b18 passed", output), output
