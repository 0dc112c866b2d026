"""Writes the tiny DCPythia and DCFormer hub folders that
`tests/models/dcformer_test.py` converts, from the DCFormer authors' own
PyTorch code (which cannot be installed, so the folders are checked in).

Run once, with a checkout of https://github.com/Caiyun-AI/DCFormer, and
committed with its output:

    python tests/models/dcformer_folders/write_folders.py \\
        --dcformer=PATH/TO/DCFormer

It imports `pytorch/dcpythia/modeling_dcpythia.py` as of the checkout's
HEAD (df8671f; unchanged since 4375c18, "fix k_mask") and
`pytorch/dcformer/modeling_dcformer.py` as of 4375c18 (the May-2024
version, the released DCFormer-2.8B's; HEAD's is a later 8B model's),
read with `git show`. For each it builds a tiny model (2 layers: the
first local with window 3, the second global; q/k norm; 4 heads of 8),
draws every weight from a normal distribution, and writes next to itself:
- `<model>/config.json` and `<model>/pytorch_model.bin`, the released
  folders' layout (the state dict as the authors' model holds it, with
  the derived `dw_m` and `qkw_m`);
- `<model>/expected.npz`: tokens [2, 10] and the authors' logits for
  them from the released inference path (`setup_caches`, then the
  prefill, `forward` with `fast_infer`), in float32; and a prompt (the
  tokens' first 4) with its greedy continuation to 10 tokens, each next
  token the argmax of a prefill over the sequence so far. (The authors'
  own `generate` decodes with a ring cache of `window_size` keys, one
  fewer than their prefill's window: docs/family.md.)

Two departures from the release, both of precision only: the model runs
in float32 (the release in float16), and the rotary table stays in
float32 (the release rounds its cos/sin table to float16). transformers
5 (not the 4.33 the authors used) serves their `PreTrainedModel` base.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# (folder, the authors' subfolder, the commit its files are read at, the
# config's extra fields).
MODELS = (
    ("dcpythia", "dcpythia", "df8671f",
     dict(rotary_pct=0.5, use_linear_bias=True, use_parallel_residual=True,
          norm_eps=1e-5, intermediate_size=64)),
    ("dcformer", "dcformer", "4375c18",
     dict(norm_eps=1e-6, intermediate_size=48)),
)


def _authors_modules(checkout, folder, commit, scratch):
  """The authors' configuration and modeling modules at `commit`."""
  os.makedirs(os.path.join(scratch, folder), exist_ok=True)
  modules = []
  for kind in ("configuration", "modeling"):
    name = f"{kind}_{folder}"
    text = subprocess.run(
        ["git", "-C", checkout, "show", f"{commit}:pytorch/{folder}/{name}.py"],
        check=True, capture_output=True, text=True).stdout
    path = os.path.join(scratch, folder, f"{name}.py")
    with open(path, "w") as f:
      f.write(text)
  sys.path.insert(0, os.path.join(scratch, folder))
  for kind in ("configuration", "modeling"):
    name = f"{kind}_{folder}"
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(scratch, folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    modules.append(module)
  sys.path.pop(0)
  return modules


def _write(checkout, folder, subfolder, commit, extra, scratch, seed):
  configuration, modeling = _authors_modules(checkout, subfolder, commit,
                                             scratch)
  config_class = next(value for name, value in vars(configuration).items()
                      if name.endswith("Config") and name != "PretrainedConfig")
  model_class = getattr(modeling, "DCPythia" if subfolder == "dcpythia"
                        else "DCFormer")
  config = config_class(vocab_size=64, dim=32, n_head=4, n_layer=2,
                        block_size=16, window_size=3, use_qk_norm=True,
                        is_training=False, **extra)
  torch.manual_seed(seed)
  model = model_class(config).float().eval()
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if name.endswith(("dw_m", "qkw_m")):
        continue  # derived: merge_weights makes them below
      # Norm scales near 1 and biases small, the rest at 0.3: the dynamic
      # weights far from the identity, attention far from uniform.
      if name.endswith(("norm.weight", "norm.scale", "_norm.weight")):
        weight.copy_(1.0 + 0.1 * torch.randn(weight.shape,
                                             generator=generator))
      else:
        scale = 0.05 if name.endswith("bias") else 0.3
        weight.copy_(scale * torch.randn(weight.shape, generator=generator))
    for block in model.layers:
      block.attention.dyn_w_proj.merge_weights()
  state = {name: value.clone() for name, value in model.state_dict().items()}
  model.setup_caches(2, 16)
  model.float()  # the caches setup_caches made in float16
  # The rotary table in float32 (the release rounds it to float16).
  rotated = model.rotary_ndims if hasattr(model, "rotary_ndims") else (
      config.dim // config.n_head)
  frequencies = 1.0 / (config.rope_base ** (
      torch.arange(0, rotated, 2)[:rotated // 2].float() / rotated))
  angles = torch.outer(torch.arange(config.block_size).float(), frequencies)
  model.freqs_cis = torch.stack([angles.cos(), angles.sin()], dim=-1)
  tokens = np.random.default_rng(seed).integers(0, 64, size=(2, 10))
  with torch.no_grad():
    logits = model(torch.from_numpy(tokens), return_tensor=True)
    greedy = torch.from_numpy(tokens[:, :4])
    while greedy.shape[1] < tokens.shape[1]:
      following = model(greedy, return_tensor=True)[:, -1].argmax(-1)
      greedy = torch.cat([greedy, following[:, None]], dim=1)
  target = os.path.join(HERE, folder)
  os.makedirs(target, exist_ok=True)
  config.to_json_file(os.path.join(target, "config.json"))
  torch.save(state, os.path.join(target, "pytorch_model.bin"))
  np.savez(os.path.join(target, "expected.npz"), tokens=tokens.astype("int32"),
           logits=logits.numpy().astype("float32"),
           prompt=tokens[:, :4].astype("int32"),
           greedy=greedy.numpy().astype("int32"))
  with open(os.path.join(target, "config.json")) as f:
    print(folder, json.load(f)["model_type"], sorted(state)[:3], "...",
          logits.shape)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dcformer", required=True,
                      help="a git checkout of Caiyun-AI/DCFormer")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as scratch:
    for seed, (folder, subfolder, commit, extra) in enumerate(MODELS):
      _write(args.dcformer, folder, subfolder, commit, extra, scratch, seed)


if __name__ == "__main__":
  main()
