"""What the converter tests share: the texts the tokenizers are compared
on, a padded batch, and the comparison of a converted model_dir's outputs
with the source library's own."""

import csv
import json
import pathlib

import numpy as np

from thattn import models

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sample_texts():
  """The README's serving sample and the docs/examples sentences."""
  texts = ["A list holds items."]
  with open(ROOT / "docs/examples/sst2_sample/train.tsv") as f:
    texts += [row["sentence"] for row in csv.DictReader(f, delimiter="\t")]
  with open(ROOT / "docs/examples/squad_sample/dev.json") as f:
    for article in json.load(f)["data"]:
      for paragraph in article["paragraphs"]:
        texts.append(paragraph["context"])
        texts += [qa["question"] for qa in paragraph["qas"]]
  return texts


def padded_batch(vocab_size):
  """Three rows, two of them padded, with both token types."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, vocab_size, (3, 12)).astype("int32")
  mask = np.ones((3, 12), "int32")
  mask[1, 7:] = 0
  mask[2, 3:] = 0
  types = np.zeros((3, 12), "int32")
  types[:, 6:] = 1
  return {"input_word_ids": ids, "input_mask": mask, "input_type_ids": types}


def encoder_outputs(outputs):
  """(sequence, pooled) of an encoder's outputs: a dict with those keys, or
  Model Garden's [sequence, pooled] list."""
  if isinstance(outputs, dict):
    return outputs["sequence_output"], outputs["pooled_output"]
  return outputs[0], outputs[1]


def assert_same_outputs(model_dir, batch, sequence, pooled):
  """thattn.models.load(model_dir)'s outputs on `batch` equal the source's
  within 1e-5 (float32)."""
  outputs = models.load(str(model_dir))(batch)
  for name, expected in (("sequence_output", sequence),
                         ("pooled_output", pooled)):
    np.testing.assert_allclose(outputs[name].numpy(), np.asarray(expected),
                               atol=1e-5, rtol=0, err_msg=name)
