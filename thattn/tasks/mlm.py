"""Masked LM (BERT's pretraining objective, without next-sentence prediction).

Rows of packed tokens, [CLS] row [SEP], are masked as BERT does (15% of the
positions; of those 80% [MASK], 10% a random token, 10% kept;
`thattn.data.masking`), and the model predicts the original tokens at the
masked positions. The held-out loss is ln(PPL) over those positions.

The head is BERT's masked-LM output layer, tied to the word embeddings
(`thattn.models.heads.MaskedLMHead`; on Keras 3,
`thattn.keras3.models.heads.MaskedLMHead`).

The default preset is the default job's model: `bert_tiny` widened to
d_model 128 and d_ff 512, so that it learns more than word frequencies in a
few minutes on 2 CPU cores. Serving: BERT's encodings of raw text.

A T5 encoder (T5Config with stacks="encoder", preset `t5_tiny_encoder`)
trains too: its own LM head scores every position, and the loss is read at
the masked ones. It is Mesh TensorFlow's "aligned" Unitransformer, so
`--backend=mtf` trains it as well; it serves predicted token ids.
"""

import numpy as np

from thattn import models
from thattn.core import requirements
from thattn.models import heads_and_losses
from thattn.models import wiring
from thattn.tasks import base
from thattn.tasks import serving
from thattn.tasks import text

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  import tf_keras
  from thattn.data import batches
  from thattn.models import front_end
  from thattn.models import heads


@base.register
class MaskedLM(text.TextTask):
  """BERT's masked LM (no NSP), on packed rows, with the tied MLM head."""

  name = "mlm"
  default_preset = "bert_tiny"
  default_overrides = {"d_model": 128, "d_ff": 512}
  default_sequence_length = 128
  # BERT and ALBERT, or a T5 encoder with its LM head (T5Config
  # stacks="encoder", e.g. t5_tiny_encoder: Mesh TensorFlow's "aligned"
  # Unitransformer, so that masked LM also trains with --backend=mtf).
  config_type = (models.BertConfig, models.T5Config)
  mtf_model = "a T5 encoder (e.g. t5_tiny_encoder)"  # aligned Unitransformer

  @classmethod
  def fits(cls, config):
    return not isinstance(config, models.T5Config) or (
        config.stacks == "encoder")

  @classmethod
  def model_description(cls):
    return "a BERT or ALBERT, or a T5 encoder (stacks='encoder'),"

  @property
  def _t5_encoder(self):
    return isinstance(self.model_config, models.T5Config)

  def _rows(self, documents):
    return batches.token_rows(documents, self.tokenizer,
                              self.sequence_length - 2,
                              separator=self.tokenizer.special.sep)

  def build(self):
    self.backbone = models.build_model(self.model_config)
    if self._t5_encoder:
      return  # its own LM head scores every position
    self.head = heads.MaskedLMHead(
        self.backbone.get_layer("word_embeddings"),
        activation=self.model_config.activation,
        initializer_range=self.model_config.initializer_range,
        layer_norm_epsilon=self.model_config.layer_norm_epsilon,
        name="masked_lm")
    # Built now, so the optimizer and a restore see all of its weights.
    self.head(self.backbone.output["sequence_output"],
              tf_keras.Input([None], dtype=tf.int32))

  def trains_weight(self, name):
    # Masked LM alone never reaches the pooler: leave it out, so no variable
    # goes without a gradient.
    return super().trains_weight(name) and "pooler/" not in name

  def _batches(self, *, seed, start_step, num_steps, train):
    rows = self.train_rows if train else self.eval_rows
    return batches.mlm_batches(rows, self.tokenizer,
                               batch_size=self.batch_size, seed=seed,
                               start_step=start_step, num_steps=num_steps,
                               shuffle=train)

  def loss(self, batch, training):
    return self.loss_of(front_end.TF_KERAS_OPS, self.backbone, self.head,
                        batch, training, pad_id=self.tokenizer.special.pad)

  @classmethod
  def keras3_parts(cls, config, head_config):
    del head_config  # the head follows the backbone's config
    from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top
    from thattn.keras3.models import heads  # pylint: disable=g-import-not-at-top
    backbone = keras3_models.build_model(config)
    if isinstance(config, models.T5Config):
      return backbone, None  # its own LM head scores every position
    head = heads.MaskedLMHead(
        backbone.get_layer("word_embeddings"), activation=config.activation,
        initializer_range=config.initializer_range,
        layer_norm_epsilon=config.layer_norm_epsilon, name="masked_lm")
    head.build((None, None, config.d_model))
    return backbone, head

  @classmethod
  def input_dtypes(cls, config, head):
    del head
    inputs = (wiring.BERT_INPUTS if isinstance(
        config, models.BertConfig) else ("input_word_ids",))
    return dict({key: "int32" for key in inputs}, masked_lm_positions="int32",
                masked_lm_ids="int32", masked_lm_weights="float32")

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    del pad_id  # the masked positions are scored, whatever the tokens
    return heads_and_losses.masked_lm_loss(task_ops, backbone, head, batch,
                                           training)

  def inputs_and_targets(self, batch):
    """The masked tokens, and the original tokens at the masked positions
    (0, not scored, elsewhere): the positions `loss` gathers."""
    inputs = np.asarray(batch["input_word_ids"], np.int32)
    targets = np.zeros_like(inputs)
    rows, slots = np.nonzero(np.asarray(batch["masked_lm_weights"]) > 0)
    positions = np.asarray(batch["masked_lm_positions"])[rows, slots]
    targets[rows, positions] = np.asarray(batch["masked_lm_ids"])[rows, slots]
    return inputs, targets

  @classmethod
  def serving_module(cls, *, config, checkpoint, tokenizer_dir):
    tokenizer, files = serving.load_tokenizer(tokenizer_dir)
    backbone = models.create_model(config["preset"], **config["overrides"])
    serving.restore(checkpoint, backbone=backbone)
    module = (T5EncoderServing if isinstance(
        models.model_config(config["preset"], **config["overrides"]),
        models.T5Config) else EncoderServing)
    return module({"backbone": backbone}, tokenizer,
                  config["sequence_length"], files)


class EncoderServing(serving.BertServing):
  """BERT encodings of raw text (serving_default) or of token ids."""

  @serving.signature(serving.TEXT)
  def serve_text(self, text):  # pylint: disable=redefined-outer-name
    features = self._features(text)
    outputs = self._encode(features)
    return {"sequence_output": outputs["sequence_output"],
            "pooled_output": outputs["pooled_output"],
            "input_mask": features["input_mask"],
            "input_word_ids": features["input_word_ids"]}

  @serving.signature(serving.IDS, serving.IDS, serving.IDS)
  def serve_token_ids(self, input_word_ids, input_mask, input_type_ids):
    outputs = self._encode(serving.bert_features(
        input_word_ids, input_mask, input_type_ids))
    return {"sequence_output": outputs["sequence_output"],
            "pooled_output": outputs["pooled_output"]}


class T5EncoderServing(serving.BertServing):
  """A T5 encoder's token predictions for raw text ([CLS] text [SEP] in)."""

  def _predict(self, input_word_ids):
    logits = self._keras.backbone({"encoder_input_tokens": input_word_ids},
                                  training=False)
    return {"logits": logits,
            "predicted_ids": tf.argmax(logits, -1, output_type=tf.int32)}

  @serving.signature(serving.TEXT)
  def serve_text(self, text):  # pylint: disable=redefined-outer-name
    ids = self._features(text)["input_word_ids"]
    return dict(self._predict(ids), input_word_ids=ids)

  @serving.signature(serving.IDS)
  def serve_token_ids(self, input_word_ids):
    return self._predict(input_word_ids)
