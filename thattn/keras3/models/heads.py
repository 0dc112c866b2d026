"""Task heads in Keras 3, and how a Keras 3 model's weights meet their
tf_keras twins'.

`MaskedLMHead` is `thattn.tasks.mlm.MaskedLMHead` in `keras.ops` (BERT's
masked-LM output layer; letters as in `thattn.dims`, p counts the masked
positions, e the embedding width):

    H[b, p, d] = gather(X[b, n, d], positions[b, p])
    T[b, p, e] = LayerNorm(act(H W_t + b_t))
    logits[b, p, t] = einsum(T[b, p, e], E[t, e]) + bias[t]

with the same weights' names (`shared_name`), so a tf_keras run's head
moves into it by name (`pair_by_name`).
"""

import keras
from keras import ops

from thattn import dims
from thattn.keras3.models import blocks
from thattn.keras3.models import embeddings


def shared_name(name):
  """What a weight's name is in both front ends: without ':0' and without
  tf_keras's doubled attention scope ('block_0/attention/attention/query/
  kernel' -> 'block_0/attention/query/kernel')."""
  parts = name.split(":")[0].split("/")
  return "/".join(part for index, part in enumerate(parts)
                  if index == 0 or part != parts[index - 1])


def pair_by_name(sources, targets):
  """[(source, target)] of two lists of weights with the same shared names.

  Args:
    sources: objects with `.name` and `.shape` (tf_keras variables).
    targets: Keras 3 variables (their `.path` is the name).
  Raises:
    ValueError naming the weights one side has and the other lacks, or
    whose shapes differ.
  """
  by_name = {shared_name(source.name): source for source in sources}
  targets_by_name = {shared_name(target.path): target for target in targets}
  missing = sorted(set(by_name) ^ set(targets_by_name))
  if missing:
    raise ValueError(f"The two models' weights differ in name: "
                     f"{', '.join(missing[:6])}"
                     f"{' ...' if len(missing) > 6 else ''}.")
  pairs = []
  for name, target in targets_by_name.items():
    source = by_name[name]
    if tuple(source.shape) != tuple(target.shape):
      raise ValueError(f"Weight {name}: shape {tuple(source.shape)} in the "
                       f"tf_keras model, {tuple(target.shape)} in Keras 3.")
    pairs.append((source, target))
  return pairs


@keras.saving.register_keras_serializable(package="thattn")
class MaskedLMHead(keras.layers.Layer):
  """Float32 logits [b, p, t] at the masked positions; see the module.

  Args:
    embedding: the backbone's `TokenEmbedding` (`word_embeddings`), whose
      table scores the outputs (tied; not serialized).
    activation: a name from thattn.models.config.ACTIVATIONS.
    initializer_range: stddev of the truncated-normal transform kernel.
  """

  def __init__(self, embedding, activation="gelu", initializer_range=0.02,
               layer_norm_epsilon=1e-12, **kwargs):
    super().__init__(**kwargs)
    if not isinstance(embedding, embeddings.TokenEmbedding):
      raise ValueError(f"embedding must be a TokenEmbedding, got "
                       f"{embedding!r}.")
    self.activation = blocks.activation_function(activation)
    self.embedding = embedding
    self.transform = keras.layers.Dense(
        embedding.width, kernel_initializer=keras.initializers.TruncatedNormal(
            stddev=initializer_range), name="transform")
    self.norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon,
                                                name="transform_norm")

  def build(self, input_shape, positions_shape=None):
    del positions_shape
    self.transform.build(input_shape)
    self.norm.build(tuple(input_shape[:-1]) + (self.embedding.width,))
    self.output_bias = self.add_weight(
        name="output_bias", shape=(self.embedding.vocab_size,),
        initializer="zeros")

  @property
  def logical_axes(self):
    # The bias follows the tied table's vocab axis (as in tf_keras).
    return {self.output_bias.path: (dims.VOCAB,)}

  def call(self, sequence_output, positions):
    hidden = ops.take_along_axis(
        sequence_output, ops.expand_dims(ops.cast(positions, "int32"), -1),
        axis=1)
    hidden = self.norm(self.activation(self.transform(hidden)))
    logits = self.embedding(hidden, mode="logits")
    return logits + ops.cast(self.output_bias, "float32")
