"""Shared by the fine-tuning tasks (classification, SQuAD).

Both take a BERT or ALBERT backbone, usually loaded with --init_checkpoint
from a masked-LM run whose tokenizer they then reuse, and add a task head.
Data is read once from one --train_files and one --eval_files file, encoded
to numpy features and served step by step
(`thattn.data.batches.feature_batches`), so a resumed run continues exactly.
The eval loss is the mean cross-entropy (mean squared error for
regression); each task's own metrics are computed over the whole eval file.
"""

import math

import numpy as np

from thattn import models
from thattn.core import requirements
from thattn.tasks import base
from thattn.tasks import serving
from thattn.tasks import text

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  from thattn.data import batches
  from thattn.data import tokenizers


def finetune_tokenizer(data, files, log=print):
  """The tokenizer: resumed, the pretraining run's, a folder, or the default.

  A fine-tuned backbone must see the ids it was pretrained on, so the
  tokenizer beside --init_checkpoint wins over --tokenizer.
  """
  for folder in (files.tokenizer_dir, files.init_tokenizer_dir):
    if text.has_tokenizer(folder):
      tokenizer = tokenizers.load(folder)
      break
  else:
    if data.tokenizer in text.TOKENIZER_KINDS:
      log(f"Tokenizer: the default corpus's {data.tokenizer} "
          f"({data.vocab_size}); pass --init_checkpoint to reuse a "
          "pretraining run's.")
      tokenizer = tokenizers.default_tokenizer(
          data.tokenizer, data.vocab_size, data.cache_dir)
    else:
      tokenizer = tokenizers.load(data.tokenizer)
  if files.tokenizer_dir and not text.has_tokenizer(files.tokenizer_dir):
    tokenizer.save(files.tokenizer_dir)
  return tokenizer


def single_file(pattern, flag):
  """The one file that `pattern` (a glob) names; `flag` names it in errors."""
  if pattern is None:
    raise ValueError(f"This task needs {flag}.")
  paths = sorted(tf.io.gfile.glob(pattern))
  if len(paths) != 1:
    raise ValueError(f"{flag}={pattern!r} must name one file, matched "
                     f"{len(paths)}.")
  return paths[0]


class FinetuneTask(base.Task):
  """Tokenizer, BERT backbone, features in memory; subclasses add `_read`."""

  default_preset = "bert_tiny"
  pretraining = False
  eval_metric = "loss"
  config_type = models.BertConfig

  def __init__(self, *, data, files, log=print, **kwargs):
    super().__init__(data=data, files=files, log=log, **kwargs)
    self.data = data
    self.log = log
    self.tokenizer = finetune_tokenizer(data, files, log=log)
    self.overrides = base.backbone_overrides(
        self.model_options, self.tokenizer.vocab_size, self.sequence_length,
        log=log)
    self.model_config = models.model_config(self.model_options.preset,
                                            **self.overrides)
    train_file = single_file(data.train_files, "--train_files")
    eval_file = single_file(data.eval_files or data.train_files,
                            "--eval_files")
    self.train_features, _ = self._read(train_file, is_training=True)
    self.eval_features, self.eval_info = self._read(eval_file,
                                                    is_training=False)

  def _read(self, path, is_training):
    raise NotImplementedError

  def _batches(self, *, seed, start_step, num_steps, train):
    features = self.train_features if train else self.eval_features
    return batches.feature_batches(features, batch_size=self.batch_size,
                                   seed=seed, start_step=start_step,
                                   num_steps=num_steps, shuffle=train)

  def _eval_outputs(self, function):
    """function(batch) (NumPy arrays of a NumPy batch) over the eval
    features in order, once, concatenated."""
    count = len(self.eval_features["input_word_ids"])
    steps = math.ceil(count / self.batch_size)
    outputs = [function(batch) for batch in self._batches(
        seed=0, start_step=0, num_steps=steps,
        train=False).as_numpy_iterator()]
    return [np.concatenate([o[i] for o in outputs])[:count]
            for i in range(len(outputs[0]))]

  def run_config(self):
    return dict(super().run_config(), overrides=self.overrides)

  @staticmethod
  def serving_backbone(config, tokenizer_dir):
    """(backbone, tokenizer, tokenizer files) of a fine-tuned model_dir."""
    tokenizer, files = serving.load_tokenizer(tokenizer_dir)
    backbone = models.create_model(config["preset"], **config["overrides"])
    return backbone, tokenizer, files
