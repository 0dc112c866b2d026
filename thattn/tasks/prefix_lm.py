"""The T5 paper's prefix LM objective (Raffel et al., 2019, section 3.2.1).

Each document's tokens are cut into pieces of at most sequence_length - 2,
and each piece is split at a random point into a prefix and a target
(`batches.prefix_lm_rows`, Mesh TensorFlow's delimited layout [prefix,
EOS, target, EOS, padding]). The model is a prefix LM (`prefix_lm=True`,
which the task sets on the backbone): attention is bidirectional over the
prefix and the position that reads its end token (t5x's
`decoder_causal_attention`), causal after it, and only the target's tokens
and its end token are scored (Mesh TensorFlow's `loss_on_targets_only`).
The held-out metric is ln(PPL) per target token.

The backbone is a `DecoderConfig` (default `lm_tiny`) or T5's decoder
alone (`t5_tiny_lm`), which is Mesh TensorFlow's `Unitransformer` with
`input_full_attention` ("delimited_lm") and so also trains on
`--backend=mtf`, reading the targets shifted right after the start token
0. A prefix LM has a causal LM's weights: `--init_checkpoint` takes a
causal_lm run, and a prefix_lm run's backbone loads as a causal LM.

Serving: the prompt is the prefix (its end token appended), and the
continuation the greedy target, text in and text out, as causal_lm serves
(`causal_lm.LMServing`).
"""

from thattn import models
from thattn.core import requirements
from thattn.models import heads_and_losses
from thattn.models import wiring
from thattn.tasks import base
from thattn.tasks import causal_lm

with requirements.lazy_imports("thattn.tasks"):
  from thattn.data import batches


@base.register
class PrefixLM(causal_lm.CausalLM):
  """Prefix-to-target prediction, the target alone scored;
  sequence_length is the model's input length."""

  name = "prefix_lm"

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    # The task's model: a prefix LM of the preset's shape (the run config
    # keeps the override, so every rebuild of the run has it).
    self.overrides["prefix_lm"] = True
    self.model_config = models.model_config(self.model_options.preset,
                                            **self.overrides)

  def _rows(self, documents):
    special = self.tokenizer.special
    return batches.prefix_lm_rows(documents, self.tokenizer,
                                  self.sequence_length + 1,
                                  eos_id=special.eos, pad_id=special.pad,
                                  seed=self.seed)

  def _batches(self, *, seed, start_step, num_steps, train):
    rows = self.train_rows if train else self.eval_rows
    t5 = isinstance(self.model_config, models.T5Config)
    return batches.prefix_lm_batches(
        rows, eos_id=self.tokenizer.special.eos, batch_size=self.batch_size,
        seed=seed, start_step=start_step, num_steps=num_steps, shuffle=train,
        start_token=wiring.DECODER_START_ID if t5 else None)

  @classmethod
  def input_dtypes(cls, config, head):
    del config, head
    return {"inputs": "int32", "targets": "int32",
            "causal_attention": "int32", "loss_weights": "int32"}

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    del head, pad_id  # the weights say what is scored
    return heads_and_losses.prefix_lm_loss(task_ops, backbone, batch,
                                           training)

  @classmethod
  def prompt_ids(cls, config, model_config):
    """(start, end): a prompt is the prefix, ended by the end token as in
    training (and started by a T5 LM's start token)."""
    start, _ = super().prompt_ids(config, model_config)
    return start, [config["eos_id"]]
