"""Synthetic associative recall: key-value pairs, then queries for the values.

Every position carries two tokens, a key and a value, whose embeddings the
model adds. The first P positions hold distinct keys with their values; the
last Q positions hold one of those keys again with the value UNKNOWN, and
there the model must predict the key's value. Answering is one attention hop
that must single out the one position whose key matches, a sharp pattern;
the low-rank bottleneck paper (Bhojanapalli et al., 2020) argues that heads
whose size d_k is below the sequence length cannot express every such
pattern, so the task gets harder as the head size shrinks.

Examples are a pure function of (seed, index), built with stateless random
ops, so a resumed run sees exactly the batches an uninterrupted run would.

Seeing the bottleneck. The knobs are the sequence length (num_pairs +
num_queries), the number of distinct keys a query must tell apart (num_keys,
or keys_per_pair in `for_sequence_length`), and the head size d_k. Keep the
model and data fixed and shrink d_k:

    for d in 1 2 4 8; do
      thattn-train --task=recall --attention=talking_heads --num_heads=1 \
          --key_dim=$d --sequence_length=64 --train_steps=1000 \
          --model_dir=/tmp/recall_$d
    done

With one head, d_model 64, 64 positions (48 pairs, 16 queries) and 192 keys,
held-out accuracy after 1000 steps was 0.006 (chance) at d_k = 1, 0.23 at 2,
0.94 at 4 and 1.00 at 8, each run 1-2 minutes on 2 CPU cores. Two caveats:
- This pattern needs far fewer than n dimensions: from d_k = 2 on, keys can
  be told apart by angle given large logits, so the drop sits well below the
  sequence length, and it moves up as keys_per_pair (the number of keys to
  separate) grows.
- Talking heads mixes the heads' logits, so h heads of size d_k give logits
  of rank up to h * d_k: with 4 heads of size 2 the same run reached 1.00.
  That is the talking-heads paper's point; sweep with one head (or
  multi-head attention) to look at d_k alone.
"""

import dataclasses

import tensorflow as tf

from thattn.ops import autograph



@dataclasses.dataclass(frozen=True)
class RecallConfig:
  """Sizes of the recall task."""
  num_pairs: int = 8
  num_queries: int = 4
  num_keys: int = 32
  num_values: int = 32

  def __post_init__(self):
    for name in ("num_pairs", "num_queries", "num_keys", "num_values"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be positive, got "
                         f"{getattr(self, name)}.")
    if self.num_pairs > self.num_keys:
      raise ValueError(f"num_pairs={self.num_pairs} needs as many distinct "
                       f"keys, but num_keys={self.num_keys}.")
    if self.num_queries > self.num_pairs:
      raise ValueError(f"num_queries={self.num_queries} must not exceed "
                       f"num_pairs={self.num_pairs}.")

  @property
  def sequence_length(self):
    return self.num_pairs + self.num_queries

  @property
  def unknown_value(self):
    """The value token at query positions; values are 0..num_values-1."""
    return self.num_values

  @classmethod
  def for_sequence_length(cls, sequence_length, *, keys_per_pair=4,
                          values_per_pair=4):
    """Three pairs per query; keys_per_pair x as many keys as pairs.

    More keys per pair means more distinct keys a query must tell apart,
    so the same head size has less room per key.
    """
    num_queries = sequence_length // 4
    num_pairs = sequence_length - num_queries
    if num_queries < 1:
      raise ValueError(f"sequence_length={sequence_length} is too short for "
                       "a recall example; use at least 4.")
    return cls(num_pairs, num_queries, num_keys=keys_per_pair * num_pairs,
               num_values=values_per_pair * num_pairs)


@autograph.unconverted
def make_example(config, seed, index):
  """One example: (tokens[L, 2], targets[L], weights[L]).

  tokens[:, 0] are keys and tokens[:, 1] values; weights mark the queries.
  """
  seeds = tf.random.experimental.stateless_split(
      tf.stack([tf.cast(seed, tf.int64), tf.cast(index, tf.int64)]), 3)
  keys = tf.argsort(tf.random.stateless_uniform([config.num_keys],
                                                seeds[0]))[:config.num_pairs]
  values = tf.random.stateless_uniform([config.num_pairs], seeds[1], 0,
                                       config.num_values, tf.int32)
  asked = tf.argsort(tf.random.stateless_uniform(
      [config.num_pairs], seeds[2]))[:config.num_queries]
  query_keys = tf.gather(keys, asked)
  unknown = tf.fill([config.num_queries], config.unknown_value)
  tokens = tf.stack([tf.concat([keys, query_keys], 0),
                     tf.concat([values, unknown], 0)], axis=1)
  targets = tf.concat([tf.zeros_like(values), tf.gather(values, asked)], 0)
  weights = tf.concat([tf.zeros([config.num_pairs], tf.float32),
                       tf.ones([config.num_queries], tf.float32)], 0)
  return tokens, targets, weights


def dataset(config, *, batch_size, seed, start_index=0):
  """Endless batches of examples start_index, start_index+1, ..."""
  indices = tf.data.Dataset.range(start_index, 2**62)
  examples = indices.map(lambda i: make_example(config, seed, i),
                         num_parallel_calls=tf.data.AUTOTUNE,
                         deterministic=True)
  return examples.batch(batch_size, drop_remainder=True).prefetch(2)
