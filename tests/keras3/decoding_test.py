"""T5 decoding in Keras 3 equals tf_keras's, token for token, on each
backend.

Here, tf_keras T5s (thattn.models) with random weights decode greedily
(`thattn.models.generate`); each Keras 3 backend (`decoding_checks.py`, a
process per backend) takes those weights and must decode the same tokens.
Untied and tied embeddings, multi-head and talking heads; the weights are
scaled so that the tokens vary (a tied model at its initial weights
repeats its start token). A decoder-only LM's beam search, from tf_keras,
likewise.
"""

import re

import numpy as np
import pytest

from tests.keras3 import processes

CASES = {"th-untied": ("talking_heads", False),
         "mha-tied": ("multi_head", True)}


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
  from thattn import models  # pylint: disable=g-import-not-at-top
  folder = tmp_path_factory.mktemp("keras3_decoding")
  rng = np.random.default_rng(0)
  for case, (attention, tied) in CASES.items():
    model = models.create_model("t5_tiny", attention=attention,
                                tie_embeddings=tied)
    weights = [rng.normal(size=w.shape).astype("float32") * 0.3
               for w in model.weights]
    model.set_weights(weights)
    encoder_tokens = rng.integers(2, 64, size=(3, 7)).astype("int32")
    encoder_tokens[1, 4:] = 0  # padding
    decoded = models.generate(model, encoder_tokens, max_length=7)
    tokens = decoded["tokens"].numpy()
    assert len(set(tokens.ravel())) > 3, tokens  # a decode worth comparing
    np.savez(folder / f"{case}.tf_keras.npz", preset="t5_tiny",
             attention=attention, tied=tied, encoder_tokens=encoder_tokens,
             tokens=tokens, scores=decoded["scores"].numpy(),
             **{f"weight_{index}": w for index, w in enumerate(weights)})
  # A Llama-shaped LM with talking heads, by beam search, its end token
  # one that the search reaches, so that beams finish.
  model = models.create_model("lm_tiny", attention="talking_heads",
                              dropout_rate=0.0)
  weights = [rng.normal(0.0, 0.3, w.shape).astype("float32")
             for w in model.weights]
  model.set_weights(weights)
  prompt = rng.integers(2, 64, size=(2, 4)).astype("int32")
  eos = int(models.generate(model, prompt, max_length=6)["tokens"][0, 2])
  decoded = models.generate(model, prompt, max_length=6, method="beam",
                            beam_size=3, eos_id=eos, pad_id=0)
  np.savez(folder / "lm_tiny_beam.lm.npz", prompt=prompt, eos=eos,
           tokens=decoded["tokens"].numpy(),
           scores=decoded["scores"].numpy(),
           **{f"weight_{index}": w for index, w in enumerate(weights)})
  return folder


@pytest.mark.parametrize("backend", processes.BACKENDS)
def test_keras3_decodes_what_tf_keras_decodes(backend, exchange):
  processes.require(backend)
  output = processes.run_pytest(backend, "decoding_checks.py",
                                THATTN_DECODING_EXCHANGE=str(exchange))
  # The cases, the refusal, three decoder-only LMs decoded with their
  # caches, four continuing prompts, two prefix LMs, the beam search and
  # the sampler's three.
  assert re.search(rf"{len(CASES) + 14} passed", output), output
  assert not re.search(r"\d+ (failed|skipped|error)", output), output
