"""The synthetic associative-recall task, with `thattn.models.RecallEncoder`.

Each example is (key, value) pairs followed by queries for some keys' values
(`thattn.data.recall`); the model must predict each queried value, which
needs one sharp attention hop per query. Multi-head attention fails here once
the head size d_k is small, and talking heads does not (docs/ablation). There
is no preset and no tokenizer: the model options are RecallEncoder's
keywords, and the held-out metrics are ln(PPL) of the values and accuracy.
"""

import dataclasses

import numpy as np

from thattn import models
from thattn.core import requirements
from thattn.core import validation
from thattn.core import variants
from thattn.models import heads_and_losses
from thattn.tasks import base
from thattn.tasks import serving

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  from thattn.data import recall
  from thattn.models import front_end

# RecallEncoder's keywords that --num_heads and the other model flags set.
MODEL_KEYWORDS = ("attention", "num_layers", "d_model", "num_heads",
                  "key_dim", "d_ff")


def _recall_arrays(batch):
  """(tokens, targets, weights) of a recall batch, a tuple or a dict."""
  if isinstance(batch, dict):
    return tuple(batch[key] for key in ("tokens", "targets", "weights"))
  return tuple(batch)


@base.register
class Recall(base.Task):
  """Associative recall; see the module."""

  name = "recall"
  default_sequence_length = 24
  supports_dropout = False

  def __init__(self, *, model, log=print, **kwargs):
    super().__init__(model=model, log=log, **kwargs)
    self.config = recall.RecallConfig.for_sequence_length(self.sequence_length)

  @classmethod
  def check_model(cls, model):
    unknown = sorted(set(model.overrides) - set(MODEL_KEYWORDS))
    if unknown:
      raise ValueError(f"--task=recall takes no {unknown}; its model options "
                       f"are {sorted(MODEL_KEYWORDS)}.")
    for name, value in model.overrides.items():
      if name == "attention":
        variants.get(value, owner="--task=recall")
      else:
        validation.positive_int(name, value, optional=True)

  def backbone_keywords(self):
    """The `RecallEncoder`'s keywords, on either front end."""
    return dict(num_keys=self.config.num_keys,
                num_values=self.config.num_values,
                **self.model_options.overrides)

  def build(self):
    self.backbone = models.RecallEncoder(**self.backbone_keywords())
    self.backbone(tf.zeros([1, self.config.sequence_length, 2], tf.int32))

  def _batches(self, *, seed, start_step, num_steps, train):
    del train  # held-out batches come from another seed
    data = recall.dataset(self.config, batch_size=self.batch_size, seed=seed,
                          start_index=start_step * self.batch_size)
    return data if num_steps is None else data.take(num_steps)

  def loss(self, batch, training):
    return self.loss_of(front_end.TF_KERAS_OPS, self.backbone, None, batch,
                        training, pad_id=0)

  @classmethod
  def keras3_parts(cls, config, head_config):
    """`config`: the `RecallEncoder`'s keywords (`keras3_options`)."""
    del head_config
    from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top
    backbone = keras3_models.RecallEncoder(**config)
    backbone(np.zeros((1, 2, 2), "int32"))  # its weights, any length
    return backbone, None

  @classmethod
  def input_dtypes(cls, config, head):
    del config, head
    return {"tokens": "int32", "targets": "int32", "weights": "float32"}

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    """`batch`: (tokens [b, n, 2], targets [b, n], weights [b, n]), or
    those under their names."""
    del head, pad_id
    return heads_and_losses.recall_loss(task_ops, backbone,
                                        _recall_arrays(batch), training)

  @classmethod
  def metric_outputs_of(cls, task_ops, backbone, head, batch):
    del task_ops, head
    return (backbone(_recall_arrays(batch)[0], training=False),)

  def keras3_options(self):
    return dict(super().keras3_options(), config=self.backbone_keywords())

  @property
  def tokens_per_step(self):
    return self.batch_size * self.config.sequence_length

  def metric_outputs(self, batch):
    """(value logits [batch, length, num_values],) of (tokens, targets,
    weights)."""
    return self.metric_outputs_of(front_end.TF_KERAS_OPS, self.backbone,
                                  None, batch)

  def metrics_of(self, predict, num_steps):
    """Accuracy of the recalled values over the held-out queries."""
    hits = count = 0.0
    for batch in self.eval_dataset(num_steps).as_numpy_iterator():
      _, targets, weights = batch
      recalled = np.argmax(predict(batch)[0], -1) == targets
      hits += float(np.sum(recalled * weights))
      count += float(np.sum(weights))
    return {"accuracy": hits / max(count, 1.0)}

  def run_config(self):
    return dict(super().run_config(),
                sequence_length=self.config.sequence_length,
                recall=dataclasses.asdict(self.config))

  @classmethod
  def serving_module(cls, *, config, checkpoint, tokenizer_dir=None):
    del tokenizer_dir  # recall has no tokenizer
    sizes = config["recall"]
    backbone = models.RecallEncoder(
        num_keys=sizes["num_keys"], num_values=sizes["num_values"],
        **config["overrides"])
    backbone(tf.zeros([1, config["sequence_length"], 2], tf.int32))
    serving.restore(checkpoint, backbone=backbone)
    return RecallServing({"backbone": backbone}, None,
                         config["sequence_length"])


class RecallServing(serving.Serving):
  """Value logits and predictions of (key, value) tokens."""

  @serving.signature(serving.Spec("int32", (None, None, 2)))
  def serve_token_ids(self, tokens):
    logits = tf.cast(self._keras.backbone(tokens, training=False), tf.float32)
    return {"logits": logits,
            "predictions": tf.argmax(logits, -1, output_type=tf.int32)}
