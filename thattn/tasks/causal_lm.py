"""Next-token language modelling, the decoder-only LMs' pretraining.

Documents (the embedded corpus, or `--train_files`: plain text, or JSON
lines with a "text" field) are tokenized, each followed by the end token,
and packed into rows of `sequence_length + 1` tokens; a row's first
`sequence_length` tokens are the model's input and its last
`sequence_length` the targets, so position i learns the token after it and
every token is scored (packed rows have no padding). The held-out metric
is ln(PPL) per target token, as for the other pretraining tasks. The
backbone is a `DecoderConfig` (default `lm_tiny`): GPT-2, Llama or
GPT-NeoX shaped, with any attention variant; or T5's decoder alone
(`T5Config(stacks="decoder")`, e.g. `t5_tiny_lm`), which is Mesh
TensorFlow's LM `Unitransformer` and so also trains on `--backend=mtf`.
That one reads its targets shifted right after the start token 0, as
Mesh TensorFlow feeds it (`batches.lm_batches(start_token=0)`).

Serving: a prompt's greedy continuation, text in and text out
(`LMServing`), `GENERATED_TOKENS` new tokens or up to the end token, each
prompt decoded on its own (prompts of a batch differ in length) with the
caches (`thattn.models.DecoderLMGenerator`); a T5 LM's text prompts start
with its start token 0, as its training inputs do. `thattn-generate`
prints continuations with the generator's other methods
(`restored_generator`).
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
  from thattn.data import batches
  from thattn.models import front_end

# The new tokens a served prompt is continued with (fewer after the end
# token).
GENERATED_TOKENS = 32


@base.register
class CausalLM(text.TextTask):
  """Next-token prediction over packed rows; sequence_length is the
  model's input length."""

  name = "causal_lm"
  default_preset = "lm_tiny"
  default_sequence_length = 128
  config_type = (models.DecoderConfig, models.T5Config)
  mtf_model = "a T5 decoder-only LM (e.g. t5_tiny_lm)"  # mtf's Unitransformer

  @classmethod
  def fits(cls, config):
    return not isinstance(config, models.T5Config) or (
        config.stacks == "decoder")

  @classmethod
  def model_description(cls):
    return "a decoder-only LM (or a T5 with stacks='decoder')"

  def _rows(self, documents):
    return batches.token_rows(documents, self.tokenizer,
                              self.sequence_length + 1,
                              separator=self.tokenizer.special.eos)

  def build(self):
    self.backbone = models.build_model(self.model_config)

  def _batches(self, *, seed, start_step, num_steps, train):
    rows = self.train_rows if train else self.eval_rows
    t5 = isinstance(self.model_config, models.T5Config)
    return batches.lm_batches(rows, batch_size=self.batch_size, seed=seed,
                              start_step=start_step, num_steps=num_steps,
                              shuffle=train,
                              start_token=wiring.DECODER_START_ID if t5
                              else None)

  def inputs_and_targets(self, batch):
    # mtf's LM Unitransformer shifts the targets right itself, as the
    # batches' inputs are for a T5 (the inputs are not read).
    return (np.asarray(batch["inputs"], np.int32),
            np.asarray(batch["targets"], np.int32))

  def loss(self, batch, training):
    return self.loss_of(front_end.TF_KERAS_OPS, self.backbone, None, batch,
                        training, pad_id=self.tokenizer.special.pad)

  @classmethod
  def keras3_parts(cls, config, head_config):
    del head_config  # no head: the LM's own output scores the targets
    from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top
    return keras3_models.build_model(config), None

  @classmethod
  def input_dtypes(cls, config, head):
    del config, head
    return {"inputs": "int32", "targets": "int32"}

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    del head, pad_id  # every target of a packed row is scored
    return heads_and_losses.causal_lm_loss(task_ops, backbone, batch,
                                           training)

  def run_config(self):
    return dict(super().run_config(), eos_id=self.tokenizer.special.eos,
                pad_id=self.tokenizer.special.pad)

  @classmethod
  def prompt_ids(cls, config, model_config):
    """(start, end): the ids before and after a prompt's tokens, as the
    training inputs have them: T5's decoder alone starts with the decoder
    start token 0; nothing else."""
    del config  # the run's ids: the prefix LM's end token
    t5 = isinstance(model_config, models.T5Config)
    return [wiring.DECODER_START_ID] if t5 else [], []

  @classmethod
  def restored_generator(cls, *, config, checkpoint, **options):
    """(a `DecoderLMGenerator` of the run's backbone at `checkpoint`, the
    ids before and after a prompt's tokens: `prompt_ids`). `options` are
    the generator's (max_length, method, ...); the end and padding ids are
    the run's."""
    model_config = models.model_config(config["preset"],
                                       **config["overrides"])
    backbone = models.build_model(model_config)
    serving.restore(checkpoint, backbone=backbone)
    generator = models.DecoderLMGenerator(
        backbone, eos_id=config["eos_id"], pad_id=config["pad_id"],
        **options)
    return (generator, *cls.prompt_ids(config, model_config))

  @classmethod
  def serving_module(cls, *, config, checkpoint, tokenizer_dir):
    tokenizer, files = serving.load_tokenizer(tokenizer_dir)
    generator, start, end = cls.restored_generator(
        config=config, checkpoint=checkpoint, max_length=GENERATED_TOKENS)
    return LMServing(generator, tokenizer, config["sequence_length"], files,
                     prompt_start=start, prompt_end=end)


class LMServing(serving.Serving):
  """Greedy continuations of prompts, from text or from token ids; a text
  prompt's tokens between `prompt_start` and `prompt_end`."""

  def __init__(self, generator, tokenizer, sequence_length, files=(),
               prompt_start=(), prompt_end=()):
    super().__init__({}, tokenizer, sequence_length, files)
    self.generator = generator
    self.prompt_start = list(prompt_start)
    self.prompt_end = list(prompt_end)
    self.saved_objects["generator"] = generator

  def _continue_each(self, prompts):
    """[b, GENERATED_TOKENS] continuations of ragged prompts [b, (p)],
    each kept to its last sequence_length - GENERATED_TOKENS tokens (the
    positions the model was trained on)."""
    budget = max(self.sequence_length - GENERATED_TOKENS -
                 len(self.prompt_start) - len(self.prompt_end), 1)
    start = tf.constant(self.prompt_start, tf.int32)
    end = tf.constant(self.prompt_end, tf.int32)
    return tf.map_fn(
        lambda ids: self.generator(
            tf.concat([start, ids[-budget:], end], 0)[None])["tokens"][0],
        prompts, fn_output_signature=tf.TensorSpec([GENERATED_TOKENS],
                                                   tf.int32))

  @serving.signature(serving.TEXT)
  def serve_text(self, text):  # pylint: disable=redefined-outer-name
    special = self.tokenizer.special
    tokens = self._continue_each(self.tokenizer.tokenize(text))
    text_out = self.tokenizer.detokenize(
        tf.RaggedTensor.from_tensor(tokens, padding=special.pad))
    return {"text": text_out, "tokens": tokens}

  @serving.signature(serving.Spec("int32", (None, None),
                                  name="prompt_tokens"))
  def serve_token_ids(self, prompt_tokens):
    """Continuations of prompts of one length (no padding), as given (a
    T5 LM's with its start token 0 first, a prefix LM's with its end
    token last)."""
    return {"tokens": self.generator(prompt_tokens)["tokens"]}
