"""Cached greedy decoding of decoder-only LMs: thattn against transformers.

Times `generate` of N new tokens after a prompt, greedy, with the KV
caches, side by side in one process (KERAS_BACKEND=jax, set here before
anything imports Keras): transformers' `generate` on CPU PyTorch (the
anchor), thattn's tf_keras `DecoderLMGenerator` (one tf.function) and
thattn's Keras 3 one on JAX (one jax.jit), each with multi-head attention
and with talking heads, on the same shapes with random weights. The
contestants run round by round, interleaved, so a noisy machine's drift
hits them alike; each is warmed up (traced, compiled) first.

    python benchmarks/decoding.py                 # lm_tiny and gpt2 shapes
    python benchmarks/decoding.py --quick         # lm_tiny, few tokens

Reports tokens/s (batch x new tokens / the median decode) and the ratios
against transformers and of talking heads against multi-head.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# thattn preset -> the transformers model of the same shape.
SHAPES = ("lm_tiny", "gpt2")
ATTENTIONS = ("multi_head", "talking_heads")


def _transformers_model(preset):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  if preset == "gpt2":
    return transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
  # lm_tiny: 2 Llama layers of width 32, 4 heads over 2 key and value heads.
  return transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=128, hidden_size=32, intermediate_size=64,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      max_position_embeddings=128, tie_word_embeddings=True)).eval()


def _contestants(preset, prompt, new_tokens):
  """{name: a function that decodes once (blocking)}."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from thattn import models  # pylint: disable=g-import-not-at-top
  from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top

  reference = _transformers_model(preset)
  torch_prompt = torch.from_numpy(prompt.astype(np.int64))

  def transformers_decode():
    with torch.no_grad():
      reference.generate(torch_prompt, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=0)

  contestants = {"transformers": transformers_decode}
  for attention in ATTENTIONS:
    tf_generator = models.DecoderLMGenerator(
        models.create_model(preset, attention=attention, dropout_rate=0.0),
        max_length=new_tokens)
    tf_prompt = tf.constant(prompt)
    contestants[f"thattn tf_keras {attention}"] = (
        lambda generator=tf_generator: generator(tf_prompt)["tokens"].numpy())
    jax_generator = keras3_models.DecoderLMGenerator(
        keras3_models.create_model(preset, attention=attention,
                                   dropout_rate=0.0),
        max_length=new_tokens)
    contestants[f"thattn keras3-jax {attention}"] = (
        lambda generator=jax_generator: jax.block_until_ready(
            generator(prompt)["tokens"]))
  return contestants


def measure(preset, *, batch, prompt_length, new_tokens, repeats):
  import numpy as np  # pylint: disable=g-import-not-at-top
  prompt = np.random.default_rng(0).integers(
      1, 100, size=(batch, prompt_length)).astype(np.int32)
  contestants = _contestants(preset, prompt, new_tokens)
  for decode in contestants.values():  # trace and compile
    decode()
  times = {name: [] for name in contestants}
  for _ in range(repeats):
    for name, decode in contestants.items():
      start = time.perf_counter()
      decode()
      times[name].append(time.perf_counter() - start)
  tokens = batch * new_tokens
  per_second = {name: tokens / statistics.median(values)
                for name, values in times.items()}
  ratios = {f"{name} / transformers": per_second[name] /
            per_second["transformers"]
            for name in per_second if name != "transformers"}
  for front in ("tf_keras", "keras3-jax"):
    ratios[f"{front} talking_heads / multi_head"] = (
        per_second[f"thattn {front} talking_heads"] /
        per_second[f"thattn {front} multi_head"])
  return {"tokens_per_second": per_second, "ratios": ratios,
          "seconds": times}


def markdown(results, settings):
  lines = [f"batch {settings['batch']}, prompt {settings['prompt_length']}, "
           f"{settings['new_tokens']} new tokens (tokens/s; ratios of "
           "tokens/s)", "", "| shape | decoder | tokens/s |", "|---|---|---|"]
  for preset, result in results.items():
    for name, value in result["tokens_per_second"].items():
      lines.append(f"| {preset} | {name} | {value:,.0f} |")
  lines += ["", "| shape | ratio | value |", "|---|---|---|"]
  for preset, result in results.items():
    for name, value in result["ratios"].items():
      lines.append(f"| {preset} | {name} | {value:.2f}x |")
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="lm_tiny only, 4 new tokens, 1 repeat")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--new_tokens", type=int, default=32)
  parser.add_argument("--prompt_length", type=int, default=16)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--out", default=None,
                      help="write <out>.json and <out>.md")
  args = parser.parse_args()
  settings = dict(batch=args.batch, prompt_length=args.prompt_length,
                  new_tokens=4 if args.quick else args.new_tokens)
  shapes = ("lm_tiny",) if args.quick else SHAPES
  results = {preset: measure(preset, repeats=1 if args.quick else
                             args.repeats, **settings)
             for preset in shapes}
  table = markdown(results, settings)
  print(table)
  if args.out:
    with open(f"{args.out}.json", "w") as f:
      json.dump({"settings": settings, "results": results}, f, indent=2)
    with open(f"{args.out}.md", "w") as f:
      f.write(table)


if __name__ == "__main__":
  main()
