"""Inputs, a training loop and a SavedModel round trip for the model tests."""

import numpy as np
import tensorflow as tf
import tf_keras

from thattn.core import variants

# Every built-in attention variant a model can be built with (the registry,
# thattn.core.variants, read before any test module registers one of its own).
VARIANTS = variants.names()


def bert_inputs(vocab_size, batch=2, length=8, seed=0):
  """Random BERT inputs; the second example has two padding positions."""
  rng = np.random.default_rng(seed)
  mask = np.ones([batch, length], np.int32)
  mask[1, -2:] = 0
  return {
      "input_word_ids": tf.constant(
          rng.integers(1, vocab_size, [batch, length]) * mask, tf.int32),
      "input_mask": tf.constant(mask),
      "input_type_ids": tf.constant(
          np.repeat([[0] * (length // 2) + [1] * (length - length // 2)],
                    batch, axis=0), tf.int32),
  }


def t5_inputs(vocab_size, batch=2, length=8, seed=0):
  """Random T5 inputs for a copy task: targets = the encoder tokens.

  Returns (inputs, targets); the decoder input is the targets shifted right
  behind the start token 0, and the second example has padding.
  """
  rng = np.random.default_rng(seed)
  tokens = rng.integers(2, vocab_size, [batch, length]).astype(np.int32)
  tokens[1, -2:] = 0
  decoder_input = np.concatenate(
      [np.zeros([batch, 1], np.int32), tokens[:, :-1]], axis=1)
  inputs = {"encoder_input_tokens": tf.constant(tokens),
            "decoder_input_tokens": tf.constant(decoder_input)}
  return inputs, tf.constant(tokens)


def bert_loss(model, inputs, training=True):
  """Cross-entropy of predicting the input tokens back from the outputs.

  Each position predicts its own token, and the pooled output the first
  token, scored against the word embedding table: a head the backbone does
  not have, but enough to see every weight learn.
  """
  outputs = model(inputs, training=training)
  table = tf.cast(model.get_layer("word_embeddings").embeddings, tf.float32)
  if table.shape[-1] != outputs["pooled_output"].shape[-1]:
    # ALBERT: map the E-wide table up to d_model.
    table = table @ tf.cast(
        model.get_layer("embedding_projection").kernel, tf.float32)
  scores = lambda x: tf.einsum("...d,td->...t", tf.cast(x, tf.float32), table)
  token_losses = tf_keras.losses.sparse_categorical_crossentropy(
      inputs["input_word_ids"], scores(outputs["sequence_output"]),
      from_logits=True)
  weights = tf.cast(inputs["input_mask"], tf.float32)
  first_token_loss = tf_keras.losses.sparse_categorical_crossentropy(
      inputs["input_word_ids"][:, 0], scores(outputs["pooled_output"]),
      from_logits=True)
  return (tf.reduce_sum(token_losses * weights) / tf.reduce_sum(weights) +
          tf.reduce_mean(first_token_loss))


def t5_loss(model, inputs, targets, training=True):
  logits = model(inputs, training=training)
  losses = tf_keras.losses.sparse_categorical_crossentropy(
      targets, logits, from_logits=True)
  weights = tf.cast(targets != 0, tf.float32)
  return tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)


def train(model, loss_fn, steps=6, learning_rate=1e-2):
  """Adam on one fixed batch; returns the loss before each step."""
  optimizer = tf_keras.optimizers.Adam(learning_rate)
  losses = []
  for _ in range(steps):
    with tf.GradientTape() as tape:
      loss = loss_fn()
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(grad is not None for grad in grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    losses.append(float(loss))
  return losses


def assert_outputs_close(got, expected, tolerance=1e-5):
  as_numpy = lambda tensor: np.asarray(tf.cast(tensor, tf.float32))
  tf.nest.map_structure(
      lambda a, b: np.testing.assert_allclose(
          as_numpy(a), as_numpy(b), rtol=tolerance, atol=tolerance),
      got, expected)


def savedmodel_round_trip(model, inputs, path, save_traces=False):
  """Saves `model` as a SavedModel, reloads it with Keras, checks outputs.

  Without `save_traces`, Keras rebuilds the model from its config (thattn's
  registered classes), which is fast; with it, every layer's call is traced
  into the SavedModel too, so it also serves without thattn.
  """
  expected = model(inputs, training=False)
  model.save(path, save_format="tf", save_traces=save_traces)
  reloaded = tf_keras.models.load_model(path, compile=False)
  assert_outputs_close(reloaded(inputs, training=False), expected)
  assert reloaded.count_params() == model.count_params()
  return reloaded


def declared_logical_axes(model):
  """{variable name: logical axes} that the model's layers declare."""
  declared = {}
  for module in model.submodules:
    axes = getattr(module, "logical_axes", None)
    if isinstance(axes, dict):
      declared.update(axes)
  return declared
