"""Hugging Face decoder-only LM folders (GPT-2, Llama, GPT-NeoX / Pythia)
for `thattn-convert`: the config and weight map of
`thattn.models.hugging_face_decoders`, and the folder's tokenizer.json read
by Hugging Face `tokenizers` (`thattn.data.hugging_face_tokenizer`: the
source's ids; a model_dir with it fine-tunes, and its export serves token
ids). A converted model_dir is a `--task=causal_lm` backbone.
"""

import dataclasses

from thattn.data import hugging_face_tokenizer
from thattn.io import hugging_face_files
from thattn.models import hugging_face_decoders


def read(path, attention):
  """The folder as a `weight_maps.Source`, with its tokenizer (None where
  it has no tokenizer.json)."""
  source = hugging_face_decoders.read(path, attention)
  tokenizer = hugging_face_tokenizer.from_folder(
      path, hugging_face_files.read_config(path),
      vocab_size=source.config.vocab_size)
  return dataclasses.replace(source, tokenizer=tokenizer)
