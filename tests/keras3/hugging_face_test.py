"""`thattn.keras3.models.load` of Hugging Face GPT-2, Llama and GPT-NeoX
folders on JAX and PyTorch without TensorFlow (hugging_face_checks.py, a
process per backend), against transformers' own logits and greedy
`generate` for the tiny models tests/models/hugging_face_decoders_test.py
saves."""

import re

import numpy as np
import pytest

from tests.models import hugging_face_decoders_test as sources
from tests.keras3 import processes

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
  folder = tmp_path_factory.mktemp("hugging_face_exchange")

  class _Here:  # tmp_path_factory's mktemp, into this one folder
    @staticmethod
    def mktemp(name):
      del name
      return folder

  for family in sorted(sources.SOURCES):
    _, model, _ = sources._saved(family, _Here)  # pylint: disable=protected-access
    tokens = sources._tokens()  # pylint: disable=protected-access
    prompt = tokens[:, :4]
    np.savez(folder / f"{family}.npz", tokens=tokens,
             logits=sources._reference_logits(model, tokens),  # pylint: disable=protected-access
             prompt=prompt,
             greedy=sources._reference_continuation(model, prompt, 5))  # pylint: disable=protected-access
  return folder


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_folders_load_without_tensorflow_with_transformers_logits(backend,
                                                                  exchange):
  processes.require(backend)
  output = processes.run_pytest(backend, "hugging_face_checks.py",
                                THATTN_HF_EXCHANGE=str(exchange))
  # Three families as two variants, the imports, the refusal.
  assert re.search(r"\b8 passed", output), output
