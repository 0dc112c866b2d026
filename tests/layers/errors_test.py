"""Bad configuration or input raises ValueError naming the values."""

import pytest
import tensorflow as tf

from thattn import layers


@pytest.mark.parametrize("make_layer,message", [
    (lambda: layers.TalkingHeadsAttention(0, 4),
     r"argument `num_heads`, expected a positive integer. Received: num_heads=0"),
    (lambda: layers.MultiHeadAttention(-2, 4),
     r"argument `num_heads`, expected a positive integer. Received: num_heads=-2"),
    (lambda: layers.TalkingHeadsAttention(4, 0),
     r"argument `key_dim`, expected a positive integer. Received: key_dim=0"),
    (lambda: layers.TalkingHeadsAttention(4, 8, num_key_heads=2.5),
     r"argument `num_key_heads`, expected a positive integer. Received: num_key_heads=2.5"),
    (lambda: layers.GeneralBilinearAttention(0),
     r"argument `num_heads`, expected a positive integer. Received: num_heads=0"),
    (lambda: layers.TalkingHeadsAttention(4, 8, num_key_heads=6,
                                          project_logits=False),
     r"project_logits=False needs num_key_heads == num_heads, got "
     r"num_key_heads=6, num_heads=4"),
    (lambda: layers.TalkingHeadsAttention(4, 8, num_value_heads=2,
                                          project_weights=False),
     r"project_weights=False needs num_value_heads == num_heads, got "
     r"num_value_heads=2, num_heads=4"),
    (lambda: layers.TalkingHeadsAttention(4, 8, dynamic_projections=["x2q"]),
     r"Unknown dynamic projections \['x2q'\]; expected a subset of"),
    (lambda: layers.TalkingHeadsAttention(4, 8, dynamic_projections="x2l"),
     r"got the string 'x2l'; write \['x2l'\]"),
    (lambda: layers.TalkingHeadsAttention(4, 8, dynamic_projections=["m2w"],
                                          project_weights=False),
     r"'m2w' is added to the static P_w, so it needs project_weights=True"),
    (lambda: layers.MultiHeadAttention(4, 8, dropout_rate=1.5),
     r"dropout_rate must be in \[0, 1\), got 1.5"),
    (lambda: layers.fixed_head_size_attention(4),
     r"exactly one of sequence_length and head_size"),
    (lambda: layers.fixed_head_size_attention(4, 16, variant="bilinear"),
     r"Unknown attention variant 'bilinear'"),
    (lambda: layers.fixed_head_size_attention(4, 16,
                                              variant="general_bilinear"),
     r"'general_bilinear' has no head size"),
])
def test_bad_configuration(make_layer, message):
  with pytest.raises(ValueError, match=message):
    make_layer()


def test_mask_whose_shape_does_not_fit():
  layer = layers.TalkingHeadsAttention(2, 4)
  x, memory = tf.zeros([2, 5, 8]), tf.zeros([2, 7, 8])
  with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5, 5\), "
                     r"expected \[batch, query_length, memory_length\] = "
                     r"\[2, 5, 7\]"):
    layer(x, memory, attention_mask=tf.ones([2, 5, 5], tf.bool))
  with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 7\)"):
    layer(x, memory, attention_mask=tf.ones([2, 7], tf.bool))


def test_additive_float_mask_is_refused_rather_than_misread():
  # 0/1 numeric masks are cast as tf_keras casts them (drop-in issue); an
  # additive mask would be misread that way, so its values are refused.
  layer = layers.MultiHeadAttention(2, 4)
  x = tf.zeros([1, 3, 8])
  additive = tf.constant([[[0.0, -1e9, -1e9]] * 3])
  with pytest.raises(ValueError, match=r"must hold only 0 and 1.*got "
                     r"float32 values \[-1000000000.0\].*mask > -1"):
    layer(x, x, attention_mask=additive)
  with pytest.raises(ValueError, match="boolean or 0/1 numbers.*got dtype "
                     "string"):
    layer(x, x, attention_mask=tf.fill([1, 3, 3], "yes"))


def test_inputs_of_wrong_rank():
  layer = layers.MultiHeadAttention(2, 4)
  with pytest.raises(ValueError, match=r"value must have shape \[batch, "
                     r"length, width\].*got \(3, 8\)"):
    layer(tf.zeros([1, 3, 8]), tf.zeros([3, 8]))


def test_general_bilinear_needs_one_memory_width():
  layer = layers.GeneralBilinearAttention(2)
  with pytest.raises(ValueError, match="key width 6 and value width 8"):
    layer(tf.zeros([1, 3, 8]), tf.zeros([1, 4, 8]), key=tf.zeros([1, 4, 6]))


@pytest.mark.parametrize("make_layer", [
    lambda: layers.TalkingHeadsAttention(2, 4),
    lambda: layers.MultiHeadAttention(2, 4),
    lambda: layers.GeneralBilinearAttention(2)])
def test_a_call_with_another_width_than_built_names_both(make_layer):
  layer = make_layer()
  layer(tf.zeros([1, 3, 16]), tf.zeros([1, 3, 16]))
  with pytest.raises(ValueError, match=r"built for query width 16, called "
                     r"with a query of width 32"):
    layer(tf.zeros([1, 3, 32]), tf.zeros([1, 3, 16]))
  # The key defaults to the value, and is checked first.
  with pytest.raises(ValueError, match=r"built for key width 16, called "
                     r"with a key of width 8"):
    layer(tf.zeros([1, 3, 16]), tf.zeros([1, 3, 8]))


def test_batch_or_memory_length_mismatch_names_the_shapes():
  layer = layers.TalkingHeadsAttention(2, 4)
  with pytest.raises(ValueError, match=r"same batch size, got shapes query "
                     r"\(2, 3, 8\), key \(3, 4, 8\), value \(3, 4, 8\)"):
    layer(tf.zeros([2, 3, 8]), tf.zeros([3, 4, 8]))
  with pytest.raises(ValueError, match=r"All dimensions of `value` and `key`, "
                     r"except the last one, must be equal. Received: "
                     r"value_shape=\(2, 4, 8\) and key_shape=\(2, 5, 8\)"):
    layer(tf.zeros([2, 3, 8]), tf.zeros([2, 4, 8]), key=tf.zeros([2, 5, 8]))
