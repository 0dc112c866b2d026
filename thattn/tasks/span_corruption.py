"""T5's span corruption (Raffel et al., 2020), the T5 presets' pretraining.

Rows of raw tokens are corrupted as T5 does (`thattn.data.span_corruption`:
15% noise in spans of mean length 3, each span replaced by a sentinel in the
inputs and spelled out after it in the targets). `sequence_length` is the
encoder input length; the raw rows and the targets are sized so that every
corrupted example fits. The decoder is taught with the targets shifted right
after the start token 0, and the held-out loss is ln(PPL) over the target
tokens. After training, the first held-out batch is also decoded greedily,
step by step with the KV caches (`thattn.models.T5Generator`; the Keras 3
backend decodes with its own model, `thattn.keras3.models.T5Generator`),
and scored against the targets (`decoding_metrics`): the share of
examples decoded exactly and of target tokens decoded right. Serving:
greedy generation from raw text.
"""

import numpy as np

from thattn import models
from thattn.core import requirements
from thattn.models import heads_and_losses
from thattn.tasks import base
from thattn.tasks import serving
from thattn.tasks import text

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  from thattn.data import batches
  from thattn.models import front_end


def decoding_metrics(targets, tokens, pad_id):
  """{"greedy_exact_match", "greedy_token_accuracy"} of decoded tokens
  [b, m] against the targets [b, m] (both padded with `pad_id` after the
  end token): the share of rows equal to their target, and of the target's
  non-padding tokens decoded at their place."""
  targets, tokens = np.asarray(targets), np.asarray(tokens)
  if targets.shape != tokens.shape:
    raise ValueError(f"Decoded tokens {tokens.shape} and targets "
                     f"{targets.shape} must have one shape.")
  scored = targets != pad_id
  right = (tokens == targets) & scored
  return {"greedy_exact_match": float(np.mean(np.all(tokens == targets,
                                                     axis=1))),
          "greedy_token_accuracy": float(right.sum() / max(scored.sum(), 1))}


# Held-out batches decoded after training (each is a whole decode).
DECODED_BATCHES = 1


@base.register
class SpanCorruption(text.TextTask):
  """T5's span corruption; sequence_length is the encoder input length."""

  name = "span_corruption"
  default_preset = "t5_tiny"
  default_sequence_length = 128
  config_type = models.T5Config
  mtf_model = "a T5 encoder-decoder (e.g. t5_tiny)"  # mtf's Bitransformer

  @classmethod
  def fits(cls, config):
    return config.stacks == "encoder_decoder"

  @classmethod
  def model_description(cls):
    return "a T5 encoder-decoder"

  def _rows(self, documents):
    raw_length, _ = batches.span_corruption_lengths(self.sequence_length)
    return batches.token_rows(documents, self.tokenizer, raw_length)

  def build(self):
    if self.tokenizer.special.pad != 0:
      raise ValueError("T5 pads with id 0, but the tokenizer's pad id is "
                       f"{self.tokenizer.special.pad}.")
    self.backbone = models.build_model(self.model_config)

  def _batches(self, *, seed, start_step, num_steps, train):
    rows = self.train_rows if train else self.eval_rows
    return batches.span_corruption_batches(
        rows, self.tokenizer, inputs_length=self.sequence_length,
        batch_size=self.batch_size, seed=seed, start_step=start_step,
        num_steps=num_steps, shuffle=train)

  def loss(self, batch, training):
    return self.loss_of(front_end.TF_KERAS_OPS, self.backbone, None, batch,
                        training, pad_id=self.tokenizer.special.pad)

  @classmethod
  def keras3_parts(cls, config, head_config):
    del head_config  # no head: the decoder's LM head scores the targets
    from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top
    return keras3_models.build_model(config), None

  @classmethod
  def input_dtypes(cls, config, head):
    del config, head
    return {"inputs": "int32", "targets": "int32"}

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    del head
    return heads_and_losses.span_corruption_loss(task_ops, backbone, batch,
                                                 training, pad_id=pad_id)

  @property
  def targets_length(self):
    return batches.span_corruption_lengths(self.sequence_length)[1]

  def extra_eval_metrics(self, num_steps, devices):
    """Greedy decoding of the first held-out batch (see the module)."""
    del num_steps  # DECODED_BATCHES, however many the loss reads
    if not devices.decodes:
      return {}
    generator = models.T5Generator(self.backbone,
                                   max_length=self.targets_length,
                                   eos_id=self.tokenizer.special.eos)
    return self.decoding_metrics(lambda inputs: devices.fetch(
        generator(devices.place(inputs))["tokens"]))

  def decoding_metrics(self, generate):
    """The decoding metrics of `generate(inputs int32 [b, n]) -> tokens
    [b, targets_length]`, a front end's greedy decoder, over the first
    DECODED_BATCHES held-out batches."""
    targets, tokens = [], []
    for batch in self.eval_dataset(DECODED_BATCHES).as_numpy_iterator():
      targets.append(batch["targets"])
      tokens.append(np.asarray(generate(batch["inputs"].astype(np.int32))))
    return decoding_metrics(np.concatenate(targets), np.concatenate(tokens),
                            self.tokenizer.special.pad)

  def inputs_and_targets(self, batch):
    # mtf's Bitransformer shifts the targets right itself, as loss() does.
    return (np.asarray(batch["inputs"], np.int32),
            np.asarray(batch["targets"], np.int32))

  @property
  def tokens_per_step(self):
    return self.batch_size * (self.sequence_length + self.targets_length)

  def run_config(self):
    return dict(super().run_config(), eos_id=self.tokenizer.special.eos)

  @classmethod
  def serving_module(cls, *, config, checkpoint, tokenizer_dir):
    tokenizer, files = serving.load_tokenizer(tokenizer_dir)
    backbone = models.create_model(config["preset"], **config["overrides"])
    serving.restore(checkpoint, backbone=backbone)
    length = config["sequence_length"]
    _, targets_length = batches.span_corruption_lengths(length)
    generator = models.T5Generator(backbone, max_length=targets_length,
                                   eos_id=config["eos_id"])
    return T5Serving(generator, tokenizer, length, files)


class T5Serving(serving.Serving):
  """T5 generation (greedy) from raw text, or from token ids."""

  def __init__(self, generator, tokenizer, sequence_length, files=()):
    super().__init__({}, tokenizer, sequence_length, files)
    self.generator = generator
    # It holds the model's weights, and its random generator's state.
    self.saved_objects["generator"] = generator

  @serving.signature(serving.TEXT)
  def serve_text(self, text):  # pylint: disable=redefined-outer-name
    special = self.tokenizer.special
    ids = self.tokenizer.tokenize(text)[:, :self.sequence_length - 1]
    ids = tf.concat([ids, tf.fill([ids.nrows(), 1], special.eos)], axis=1)
    tokens = self.generator(ids.to_tensor(special.pad))["tokens"]
    text_out = self.tokenizer.detokenize(
        tf.RaggedTensor.from_tensor(tokens, padding=special.pad))
    return {"text": text_out, "tokens": tokens}

  @serving.signature(serving.Spec("int32", (None, None),
                                  name="encoder_input_tokens"))
  def serve_token_ids(self, encoder_input_tokens):
    return {"tokens": self.generator(encoder_input_tokens)["tokens"]}
