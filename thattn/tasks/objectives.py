"""What the trainer trains: one `Objective` per task, built from keywords.

An objective owns its data (tokenizer, in-memory rows), its model (backbone
and head) and its loss. The trainer (`thattn.tasks.trainer`) only asks it:

- `build()`: create the layers (inside the strategy's scope);
- `train_dataset(start_step)` and `eval_dataset()`: step-addressed batches
  (`thattn.tasks.lm_data`), so a resumed run continues exactly;
- `loss(batch, training)`: `(sum of weighted losses, sum of weights)` in
  nats, so the trainer can average over replicas and batches exactly; for
  the language-modeling tasks the mean is ln(PPL);
- `checkpoint_items()`: the trackables to save (`backbone`, `head`), so that
  `--init_checkpoint` can load a pretrained backbone into a fine-tuning run;
- `run_config()`: what `thattn-export` needs to rebuild the model.

Metrics computed outside the loss (`extra_eval_metrics`) put their batches
on the model's devices with `place_batch` and bring outputs back with
`fetch`: as they are by default, onto and off a DTensor mesh when
`thattn.tasks.dtensor_training` trains the objective.

Pretraining tasks live here: masked LM (BERT/ALBERT presets), T5 span
corruption, and the synthetic recall task. Fine-tuning tasks
(classification, SQuAD) live in `thattn.tasks.finetuning`.
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf
import tf_keras

from thattn import models
from thattn.tasks import corpus
from thattn.tasks import heads
from thattn.tasks import lm_data
from thattn.tasks import recall
from thattn.tasks import recall_model
from thattn.tasks import sources
from thattn.tasks import tokenizers

TOKENIZER_DIR = "tokenizer"
TOKENIZER_KINDS = ("sentencepiece", "wordpiece")
# Every HELDOUT_EVERY-th document of --train_files is held out when no
# --eval_files are given.
HELDOUT_EVERY = 20
# Embedding layers that --freeze_embeddings keeps fixed.
EMBEDDING_LAYERS = ("word_embeddings", "position_embedding", "type_embeddings",
                    "token_embedding", "embedding_projection")
# Examples in eval batches come from a seed stream apart from training's.
EVAL_SEED_OFFSET = 1_000_003


@dataclasses.dataclass(frozen=True)
class DataOptions:
  """Where text comes from and how it is tokenized (all tasks but recall)."""
  train_files: str = None  # glob; None: the embedded default corpus
  eval_files: str = None  # glob; None: held-out split (see HELDOUT_EVERY)
  tokenizer: str = "sentencepiece"  # a kind, or a folder Tokenizer.save wrote
  vocab_size: int = 8000
  cache_dir: str = None  # default corpus cache; None: $THATTN_CACHE_DIR


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """The backbone: a preset, overrides, and training-time switches."""
  preset: str
  overrides: dict = dataclasses.field(default_factory=dict)
  freeze_embeddings: bool = False


def _documents(pattern):
  texts = sources.text_files(pattern, split_blank_lines=True)
  return [text.decode("utf-8") for text in texts.as_numpy_iterator()]


def load_documents(data):
  """(train documents, held-out documents) as lists of strings."""
  if data.train_files is None:
    if data.eval_files is not None:
      raise ValueError("--eval_files needs --train_files; the default corpus "
                       "has its own held-out split.")
    return (corpus.documents("train", data.cache_dir),
            corpus.documents("heldout", data.cache_dir))
  documents = _documents(data.train_files)
  if data.eval_files is not None:
    return documents, _documents(data.eval_files)
  if len(documents) < 2:
    raise ValueError(f"--train_files={data.train_files!r} holds "
                     f"{len(documents)} document(s); hold-out needs at least "
                     "2, or pass --eval_files.")
  heldout = documents[::HELDOUT_EVERY]
  train = [d for i, d in enumerate(documents) if i % HELDOUT_EVERY]
  return train, heldout


def prepare_tokenizer(data, model_dir, documents=None, log=print):
  """The run's tokenizer: resumed, given, default, or learned; saved once.

  Order: `model_dir/tokenizer` (a resumed run keeps its tokenizer); a folder
  named by `data.tokenizer`; for the default corpus, the cached default
  tokenizer of that kind; else one learned from `documents`.
  """
  saved = os.path.join(model_dir, TOKENIZER_DIR)
  if tf.io.gfile.exists(os.path.join(saved, tokenizers.CONFIG_FILE)):
    return tokenizers.load(saved)
  if data.tokenizer not in TOKENIZER_KINDS:
    if not tf.io.gfile.isdir(data.tokenizer):
      raise ValueError(f"tokenizer must be one of {TOKENIZER_KINDS} or a "
                       f"folder written by Tokenizer.save, got "
                       f"{data.tokenizer!r}.")
    tokenizer = tokenizers.load(data.tokenizer)
  elif data.train_files is None:
    log(f"Tokenizer: {data.tokenizer}, {data.vocab_size} tokens, learned "
        "from the default corpus (cached after the first run).")
    tokenizer = tokenizers.default_tokenizer(data.tokenizer, data.vocab_size,
                                             data.cache_dir)
  else:
    paragraphs = [line for document in documents
                  for line in document.split("\n") if line.strip()]
    log(f"Tokenizer: learning a {data.tokenizer} vocabulary of "
        f"{data.vocab_size} from {len(paragraphs):,} lines.")
    learn = (tokenizers.train_sentencepiece if data.tokenizer ==
             "sentencepiece" else tokenizers.learn_wordpiece)
    tokenizer = learn(paragraphs, data.vocab_size)
  tokenizer.save(saved)
  return tokenizer


def backbone_overrides(model, vocab_size, sequence_length, log=print):
  """The preset's overrides for this run: the vocabulary and positions.

  A BERT preset whose position table is shorter than sequence_length gets
  one as long (the tiny presets have 64 positions).
  """
  overrides = dict(model.overrides, vocab_size=vocab_size)
  config = models.model_config(model.preset, **overrides)
  if (isinstance(config, models.BertConfig) and
      config.position_embedding == "absolute" and
      config.max_position_embeddings < sequence_length):
    log(f"{model.preset}: {config.max_position_embeddings} positions -> "
        f"{sequence_length}, for sequence_length={sequence_length}.")
    overrides["max_position_embeddings"] = sequence_length
  return overrides


def trainable_variables(layers, freeze_embeddings):
  """The variables of layers, once each, minus frozen embeddings.

  A head that ties its output to the backbone's embeddings lists that
  table too; it is kept once, or the optimizer would step it twice.
  """
  variables, seen = [], set()
  for layer in layers:
    for variable in layer.trainable_variables:
      if variable.ref() in seen or (freeze_embeddings and any(
          f"{name}/" in variable.name for name in EMBEDDING_LAYERS)):
        continue
      seen.add(variable.ref())
      variables.append(variable)
  return variables


class Objective:
  """The interface the trainer uses; see the module docstring."""

  task = None
  eval_metric = "ln_ppl"  # name of the eval loss in logs and summaries

  def __init__(self, *, batch_size, sequence_length, seed):
    self.batch_size = batch_size
    self.sequence_length = sequence_length
    self.seed = seed
    self.backbone = None
    self.head = None
    self.place_batch = lambda batch: batch
    self.fetch = np.asarray

  def checkpoint_items(self):
    items = {"backbone": self.backbone}
    if self.head is not None:
      items["head"] = self.head
    return items

  def eval_dataset(self, num_steps):
    return self._batches(seed=self.seed + EVAL_SEED_OFFSET, start_step=0,
                         num_steps=num_steps, train=False)

  def train_dataset(self, start_step):
    return self._batches(seed=self.seed, start_step=start_step,
                         num_steps=None, train=True)

  def describe(self):
    return f"{self.task}, {self.backbone.count_params():,} parameters"

  def extra_eval_metrics(self, num_steps):  # pylint: disable=unused-argument
    """Task metrics beyond the eval loss (fine-tuning tasks)."""
    return {}


class _TextObjective(Objective):
  """Shared by masked LM and span corruption: documents and a tokenizer."""

  def __init__(self, *, data, model, model_dir, log=print, **kwargs):
    super().__init__(**kwargs)
    self.data = data
    self.model_options = model
    train, heldout = load_documents(data)
    self.tokenizer = prepare_tokenizer(data, model_dir, train, log=log)
    self.train_rows = self._rows(train)
    self.eval_rows = self._rows(heldout)
    log(f"Data: train {sizes(self.train_rows)}; held out "
        f"{sizes(self.eval_rows)}.")
    self.overrides = backbone_overrides(model, self.tokenizer.vocab_size,
                                        self.sequence_length, log=log)
    self.model_config = models.model_config(model.preset, **self.overrides)

  @property
  def trainable_variables(self):
    return trainable_variables([self.backbone, self.head] if self.head
                               else [self.backbone],
                               self.model_options.freeze_embeddings)

  def run_config(self):
    return {"task": self.task, "preset": self.model_options.preset,
            "overrides": self.overrides,
            "sequence_length": self.sequence_length,
            "tokenizer_dir": TOKENIZER_DIR}


class MaskedLM(_TextObjective):
  """BERT's masked LM (no NSP), on packed rows, with the tied MLM head."""

  task = "mlm"

  def _rows(self, documents):
    return lm_data.token_rows(documents, self.tokenizer,
                              self.sequence_length - 2,
                              separator=self.tokenizer.special.sep)

  def build(self):
    if not isinstance(self.model_config, models.BertConfig):
      raise ValueError(f"--task=mlm needs a BERT or ALBERT preset, got "
                       f"{self.model_options.preset!r}.")
    self.backbone = models.build_model(self.model_config)
    self.head = heads.MaskedLMHead(
        self.backbone.get_layer("word_embeddings"),
        activation=self.model_config.activation,
        initializer_range=self.model_config.initializer_range,
        layer_norm_epsilon=self.model_config.layer_norm_epsilon,
        name="masked_lm")
    # Built now, so the optimizer and a restore see all of its weights.
    self.head(self.backbone.output["sequence_output"],
              tf_keras.Input([None], dtype=tf.int32))

  @property
  def trainable_variables(self):
    # Masked LM alone never reaches the pooler: leave it out, so no variable
    # goes without a gradient.
    return [v for v in super().trainable_variables
            if "pooler/" not in v.name]

  def _batches(self, *, seed, start_step, num_steps, train):
    rows = self.train_rows if train else self.eval_rows
    return lm_data.mlm_batches(rows, self.tokenizer,
                               batch_size=self.batch_size, seed=seed,
                               start_step=start_step, num_steps=num_steps,
                               shuffle=train)

  def loss(self, batch, training):
    outputs = self.backbone({key: batch[key] for key in (
        "input_word_ids", "input_mask", "input_type_ids")}, training=training)
    logits = self.head(outputs["sequence_output"],
                       batch["masked_lm_positions"])
    return heads.masked_cross_entropy(batch["masked_lm_ids"], logits,
                                      batch["masked_lm_weights"])

  @property
  def tokens_per_step(self):
    return self.batch_size * self.sequence_length


class SpanCorruption(_TextObjective):
  """T5's span corruption; sequence_length is the encoder input length."""

  task = "span_corruption"

  def _rows(self, documents):
    raw_length, _ = lm_data.span_corruption_lengths(self.sequence_length)
    return lm_data.token_rows(documents, self.tokenizer, raw_length)

  def build(self):
    if not isinstance(self.model_config, models.T5Config):
      raise ValueError(f"--task=span_corruption needs a T5 preset, got "
                       f"{self.model_options.preset!r}.")
    if self.tokenizer.special.pad != 0:
      raise ValueError("T5 pads with id 0, but the tokenizer's pad id is "
                       f"{self.tokenizer.special.pad}.")
    self.backbone = models.build_model(self.model_config)

  def _batches(self, *, seed, start_step, num_steps, train):
    rows = self.train_rows if train else self.eval_rows
    return lm_data.span_corruption_batches(
        rows, self.tokenizer, inputs_length=self.sequence_length,
        batch_size=self.batch_size, seed=seed, start_step=start_step,
        num_steps=num_steps, shuffle=train)

  def loss(self, batch, training):
    targets = batch["targets"]
    # Teacher forcing: the decoder reads the targets shifted right, after
    # the start token 0.
    decoder_inputs = tf.pad(targets[:, :-1], [[0, 0], [1, 0]])
    logits = self.backbone({"encoder_input_tokens": batch["inputs"],
                            "decoder_input_tokens": decoder_inputs},
                           training=training)
    weights = tf.cast(tf.not_equal(targets, self.tokenizer.special.pad),
                      tf.float32)
    return heads.masked_cross_entropy(targets, logits, weights)

  @property
  def tokens_per_step(self):
    _, targets_length = lm_data.span_corruption_lengths(self.sequence_length)
    return self.batch_size * (self.sequence_length + targets_length)

  def run_config(self):
    return dict(super().run_config(), eos_id=self.tokenizer.special.eos)


class Recall(Objective):
  """The synthetic associative-recall task with `RecallEncoder`.

  Model options are RecallEncoder's keywords (attention, num_layers,
  d_model, num_heads, key_dim); there is no preset and no tokenizer.
  """

  task = "recall"

  def __init__(self, *, model, log=print, **kwargs):  # pylint: disable=unused-argument
    super().__init__(**kwargs)
    self.model_options = model
    self.config = recall.RecallConfig.for_sequence_length(self.sequence_length)
    allowed = {"attention", "num_layers", "d_model", "num_heads", "key_dim",
               "d_ff"}
    unknown = sorted(set(model.overrides) - allowed)
    if unknown:
      raise ValueError(f"--task=recall takes no {unknown}; its model options "
                       f"are {sorted(allowed)}.")

  def build(self):
    self.backbone = recall_model.RecallEncoder(
        num_keys=self.config.num_keys, num_values=self.config.num_values,
        **self.model_options.overrides)
    self.backbone(tf.zeros([1, self.config.sequence_length, 2], tf.int32))

  @property
  def trainable_variables(self):
    return self.backbone.trainable_variables

  def _batches(self, *, seed, start_step, num_steps, train):  # pylint: disable=unused-argument
    data = recall.dataset(self.config, batch_size=self.batch_size, seed=seed,
                          start_index=start_step * self.batch_size)
    return data if num_steps is None else data.take(num_steps)

  def loss(self, batch, training):
    tokens, targets, weights = batch
    return heads.masked_cross_entropy(
        targets, self.backbone(tokens, training=training), weights)

  @property
  def tokens_per_step(self):
    return self.batch_size * self.config.sequence_length

  def extra_eval_metrics(self, num_steps):
    """Accuracy of the recalled values over the held-out queries."""
    @tf.function
    def correct(tokens, targets, weights):
      hits = tf.cast(tf.equal(tf.argmax(self.backbone(tokens), -1,
                                        output_type=tf.int32), targets),
                     tf.float32)
      return tf.reduce_sum(hits * weights), tf.reduce_sum(weights)
    hits = count = 0.0
    for batch in self.eval_dataset(num_steps):
      batch_hits, batch_count = correct(*self.place_batch(batch))
      hits, count = hits + float(batch_hits), count + float(batch_count)
    return {"accuracy": hits / max(count, 1.0)}

  def run_config(self):
    return {"task": self.task, "preset": None,
            "overrides": dict(self.model_options.overrides),
            "sequence_length": self.config.sequence_length,
            "recall": dataclasses.asdict(self.config)}


def sizes(rows):
  """Rows and tokens of an int array of rows, for log lines."""
  rows = np.asarray(rows)
  return f"{rows.shape[0]:,} rows, {rows.size:,} tokens"
