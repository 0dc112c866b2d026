"""The files of a Hugging Face model folder (what `save_pretrained` writes),
read without TensorFlow: `config.json`, and the weights as
`model.safetensors` (or sharded, with `model.safetensors.index.json`), or
as `pytorch_model.bin` (or sharded, with `pytorch_model.bin.index.json`,
as the DCFormer authors' hub folders hold them) where PyTorch is
installed, read with `torch.load(weights_only=True)`.

Plain Python over NumPy and safetensors: `thattn.converters.hugging_face`
(BERT, ALBERT) reads its folders with it, and
`thattn.models.hugging_face_decoders` (GPT-2, Llama, GPT-NeoX) too,
which `thattn.keras3.models.load` reads on JAX or PyTorch alone.
"""

import json
import os

import numpy as np

from thattn.core import requirements

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"


def read_config(path):
  with open(os.path.join(path, CONFIG_FILE)) as f:
    return json.load(f)


def model_type(path):
  """config.json's `model_type`, or None where the folder has no readable
  config.json."""
  try:
    return read_config(path).get("model_type")
  except (ValueError, OSError):
    return None


def read_arrays(path, prefixes=()):
  """{name: float32 array} of the folder's weights, each name without the
  first of `prefixes` it starts with (a task model's `bert.`,
  `transformer.`, ..., which a bare model lacks)."""
  index = os.path.join(path, SAFETENSORS_INDEX)
  if os.path.isfile(os.path.join(path, SAFETENSORS_FILE)) or os.path.isfile(
      index):
    from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top
    files = [SAFETENSORS_FILE]
    if os.path.isfile(index):
      with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    arrays = {}
    for name in files:
      arrays.update(safetensors_numpy.load_file(os.path.join(path, name)))
  elif os.path.isfile(os.path.join(path, TORCH_FILE)):
    arrays = _torch_arrays(os.path.join(path, TORCH_FILE))
  elif os.path.isfile(os.path.join(path, TORCH_INDEX)):
    with open(os.path.join(path, TORCH_INDEX)) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    arrays = {}
    for name in files:
      arrays.update(_torch_arrays(os.path.join(path, name)))
  else:
    raise ValueError(f"{path} holds neither {SAFETENSORS_FILE} nor "
                     f"{TORCH_FILE} (nor their sharded indexes); expected "
                     "a folder save_pretrained wrote.")
  result = {}
  for name, value in arrays.items():
    for prefix in prefixes:
      if name.startswith(prefix):
        name = name[len(prefix):]
        break
    result[name] = np.asarray(value, np.float32)
  return result


def _torch_arrays(file_path):
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(
        f"{file_path} is a PyTorch pickle, which needs PyTorch to read: "
        f"{requirements.install_command('torch')}; or save the model as "
        "model.safetensors (save_pretrained's default).") from None
  state = torch.load(file_path, map_location="cpu", weights_only=True)
  return {name: value.float().numpy() for name, value in state.items()}
