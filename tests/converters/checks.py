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


def write_tf1_checkpoint(prefix, shapes, *, seed, state=True):
  """A TF1 name-based checkpoint at `prefix`, as google-research/bert and
  albert saved theirs: {name: shape} variables of random values (LayerNorm
  gammas about 1) and a global_step; `state`: whether a `checkpoint` state
  file names it (ALBERT's releases ship none)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  with tf.Graph().as_default():
    variables = {name: tf.compat.v1.Variable(
        (1.0 if name.endswith("gamma") else 0.0) +
        rng.normal(0, 0.2, shape).astype("float32"), name=name)
                 for name, shape in shapes.items()}
    variables["global_step"] = tf.compat.v1.Variable(
        np.int64(1000), name="global_step")
    saver = tf.compat.v1.train.Saver(variables, save_relative_paths=True)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      saver.save(session, str(prefix), write_meta_graph=False,
                 write_state=state)


def restored_outputs(encoder, checkpoint_folder, vocab_size):
  """(batch, sequence, pooled) of a Model Garden encoder restored from the
  newest checkpoint its converter wrote (tf.train.Checkpoint(encoder=))."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.train.Checkpoint(encoder=encoder).restore(tf.train.latest_checkpoint(
      str(checkpoint_folder))).assert_existing_objects_matched()
  batch = padded_batch(vocab_size)
  return (batch, *encoder_outputs(encoder(batch)))


# Texts for ALBERT's normalization: `` and '', accents and a ligature, a
# hyphen (a user-defined piece) inside a word, and digits before commas.
ALBERT_TEXTS = ("In 1990, the Café opened ``quoted'' text.",
                "By 2001, 1990, and 1,000 people used self-attention.",
                "Crème Brûlée, À LA CARTE: ﬁne x²,  spaced\tout.")


def albert_sentencepiece(vocab_size):
  """A SentencePiece model trained on the sample texts as ALBERT's
  30k-clean.model was: <pad>=0, <unk>=1, [CLS], [SEP], [MASK] control
  pieces, no end of sequence, ALBERT's user-defined symbols; and, so that
  pieces like "1990," exist to split, numbers not split from commas."""
  import io  # pylint: disable=g-import-not-at-top
  import sentencepiece  # pylint: disable=g-import-not-at-top
  model = io.BytesIO()
  texts = sample_texts() + list(ALBERT_TEXTS) * 20
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model,
      vocab_size=vocab_size, model_type="unigram", pad_id=0, unk_id=1,
      eos_id=-1, bos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
      user_defined_symbols=["(", ")", '"', "-", ".", "–", "£", "€"],
      split_by_number=False, num_threads=1, input_sentence_size=0,
      shuffle_input_sentence=False, minloglevel=2)
  return model.getvalue()
