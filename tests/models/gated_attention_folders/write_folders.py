"""Writes the tiny Qwen3 folders with gated attention that
`tests/models/gated_attention_test.py` converts, from the gated-attention
paper's own code (Qiu et al., 2025; qiuzh20/gated_attention, which cannot
be installed, so the folders are checked in).

Run once, with a checkout of https://github.com/qiuzh20/gated_attention
and the transformers its code was written for (it imports modules that
transformers 5 removed), and committed with its output:

    pip install --target /tmp/transformers_4 --no-deps \\
        transformers==4.51.3 'tokenizers>=0.21,<0.22' 'huggingface_hub<1.0'
    PYTHONPATH=/tmp/transformers_4 python \\
        tests/models/gated_attention_folders/write_folders.py \\
        --gated_attention=PATH/TO/gated_attention

It imports the checkout's `configuration_qwen3.py` and `modeling_qwen3.py`
(HEAD 49645df), builds a tiny Qwen3 with a head-wise and one with an
element-wise gate (4 query heads over 2 key and value heads, so q_proj's
rows are grouped per key-value head; q/k norm), draws every weight from a
normal distribution, and writes next to itself, for each:
- `<gate>/`: what `save_pretrained` writes (config.json with model_type
  qwen3 and the gate's key, model.safetensors);
- `<gate>/expected.npz`: tokens [2, 9] and the model's logits (eager
  attention, float32); a prompt (the first 4) and its greedy
  continuation to 9 tokens, each token the argmax of a whole pass over
  the sequence so far.
"""

import argparse
import importlib.util
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
GATES = {"headwise": "headwise_attn_output_gate",
         "elementwise": "elementwise_attn_output_gate"}


def _module(checkout, name):
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(checkout, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  source = open(os.path.join(checkout, f"{name}.py")).read()
  # The modeling file imports its configuration relatively (a package in
  # the hub's layout); here it is a top-level module.
  source = source.replace("from .configuration_qwen3 import",
                          "from configuration_qwen3 import")
  exec(compile(source, spec.origin, "exec"), module.__dict__)  # pylint: disable=exec-used
  return module


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--gated_attention", required=True,
                      help="a checkout of qiuzh20/gated_attention")
  args = parser.parse_args()
  configuration = _module(args.gated_attention, "configuration_qwen3")
  modeling = _module(args.gated_attention, "modeling_qwen3")
  for seed, (folder, key) in enumerate(sorted(GATES.items())):
    config = configuration.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, qkv_bias=False,
        use_qk_norm=True, attn_implementation="eager", **{key: True})
    torch.manual_seed(seed)
    model = modeling.Qwen3ForCausalLM(config).float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
      for name, weight in model.named_parameters():
        if name.endswith("norm.weight"):
          weight.copy_(1.0 + 0.1 * torch.randn(weight.shape,
                                               generator=generator))
        else:
          weight.copy_(0.3 * torch.randn(weight.shape, generator=generator))
    tokens = np.random.default_rng(seed).integers(0, 64, size=(2, 9))
    with torch.no_grad():
      logits = model(torch.from_numpy(tokens)).logits
      greedy = torch.from_numpy(tokens[:, :4])
      while greedy.shape[1] < tokens.shape[1]:
        following = model(greedy).logits[:, -1].argmax(-1)
        greedy = torch.cat([greedy, following[:, None]], dim=1)
    target = os.path.join(HERE, folder)
    model.save_pretrained(target)
    np.savez(os.path.join(target, "expected.npz"),
             tokens=tokens.astype("int32"),
             logits=logits.numpy().astype("float32"),
             prompt=tokens[:, :4].astype("int32"),
             greedy=greedy.numpy().astype("int32"))
    print(folder, sorted(os.listdir(target)))


if __name__ == "__main__":
  main()
