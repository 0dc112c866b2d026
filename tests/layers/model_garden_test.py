"""thattn's TalkingHeadsAttention against Model Garden's, weight for weight.

Model Garden (`tf-models-official`) implements talking heads only in the
square case h_k = h = h_v with d_k = d_v, and it scales the logits by
1/sqrt(d_k) at run time. thattn never scales at run time (docs/architecture.md,
"Conventions"), so copying Model Garden's weights into thattn means folding that
factor into thattn's query kernel:

    P_q(thattn) = P_q(Model Garden) / sqrt(d_k)

Everything else maps one to one, with biases off on both sides:

| Model Garden weight          | shape            | thattn token              |
|------------------------------|------------------|---------------------------|
| query/kernel                 | [d_query, h, d_k] | query                    |
| key/kernel                   | [d_mem, h, d_k]   | key                      |
| value/kernel                 | [d_mem, h, d_v]   | value                    |
| attention_output/kernel      | [h, d_v, d_out]   | output                   |
| pre_softmax_weight           | [h, h]            | pre_softmax_projection   |
| post_softmax_weight          | [h, h]            | post_softmax_projection  |

Both layers apply the mask after the pre-softmax projection, and both return
as attention scores the post-softmax-projected weights U[b, h_v, n, m]
(before dropout), so outputs and scores are compared.

Model Garden is not a dependency of thattn: it pins an older TensorFlow and
is installed with --no-deps (see benchmarks/README.md). Without it these
tests are skipped.
"""

import numpy as np
import pytest
import tensorflow as tf

mg_layers = pytest.importorskip(
    "official.nlp.modeling.layers",
    reason="Model Garden is not installed; see benchmarks/README.md "
    "(pip install --no-deps tf-models-official==2.20.0 gin-config scipy)")

from thattn.layers import TalkingHeadsAttention  # pylint: disable=g-import-not-at-top

BATCH = 2
QUERY_LENGTH = 5
MEMORY_LENGTH = 7
WIDTH = 16
NUM_HEADS = 4
KEY_DIM = 4

# Model Garden name path -> thattn name path, both matched as the trailing
# components of a variable's name ("layer/query/kernel:0" -> query, kernel).
MG_TO_THATTN = {
    ("query", "kernel"): ("query", "kernel"),
    ("key", "kernel"): ("key", "kernel"),
    ("value", "kernel"): ("value", "kernel"),
    ("attention_output", "kernel"): ("output", "kernel"),
    ("pre_softmax_weight",): ("pre_softmax_projection",),
    ("post_softmax_weight",): ("post_softmax_projection",),
}

# "self": the memory is the query sequence. "cross": a longer memory.
# "cross_key": a separate key input, so that swapping the roles of key and
# value would show.
SHAPES = ("self", "cross", "cross_key")
MASKS = ("none", "boolean", "causal", "boolean_and_causal")


def _variable(layer, path):
  """The one variable of `layer` whose name ends with the components `path`."""
  found = [v for v in layer.weights
           if tuple(v.name.split(":")[0].split("/")[-len(path):]) == path]
  if len(found) != 1:
    raise AssertionError(
        f"expected one variable named .../{'/'.join(path)} in {layer.name}, "
        f"found {[v.name for v in found]} among "
        f"{[v.name for v in layer.weights]}")
  return found[0]


def _inputs(rng, shape):
  """(query, value, key) float32 tensors; key is None unless `cross_key`."""
  query = rng.normal(size=(BATCH, QUERY_LENGTH, WIDTH))
  if shape == "self":
    return tf.constant(query, tf.float32), tf.constant(query, tf.float32), None
  value = rng.normal(size=(BATCH, MEMORY_LENGTH, WIDTH))
  key = rng.normal(size=value.shape) if shape == "cross_key" else None
  to_tensor = lambda x: None if x is None else tf.constant(x, tf.float32)
  return to_tensor(query), to_tensor(value), to_tensor(key)


def _mask(rng, kind, memory_length):
  """(boolean attention_mask or None, use_causal_mask).

  Memory position 0 stays open for every query, so no softmax row is fully
  masked: there the two layers legitimately differ (Model Garden adds -1e9 to
  the logits, thattn replaces them with it).
  """
  boolean = None
  if "boolean" in kind:
    boolean = rng.random((BATCH, QUERY_LENGTH, memory_length)) < 0.6
    boolean[:, :, 0] = True
    boolean = tf.constant(boolean)
  return boolean, "causal" in kind


def _paired_layers(rng, query, value, key, dropout=0.0):
  """Model Garden's layer and thattn's, built with the same random weights."""
  mg = mg_layers.TalkingHeadsAttention(
      num_heads=NUM_HEADS, key_dim=KEY_DIM, value_dim=KEY_DIM, use_bias=False,
      dropout=dropout)
  th = TalkingHeadsAttention(
      num_heads=NUM_HEADS, key_dim=KEY_DIM, value_dim=KEY_DIM, use_bias=False,
      dropout_rate=dropout)
  mg(query, value, key=key)  # creates the weights
  th(query, value, key=key)
  assert len(mg.weights) == len(th.weights) == len(MG_TO_THATTN), (
      [v.name for v in mg.weights], [v.name for v in th.weights])
  for mg_path, th_path in MG_TO_THATTN.items():
    mg_var, th_var = _variable(mg, mg_path), _variable(th, th_path)
    assert mg_var.shape == th_var.shape, (mg_var.name, th_var.name)
    # Random N(0, 1/fan_in) weights: far from any initializer's values, with
    # logits of order 1 so that the softmax is not saturated.
    fan_in_axes = 2 if mg_path[0] == "attention_output" else 1
    fan_in = np.prod(mg_var.shape[:fan_in_axes])
    value_np = rng.normal(size=mg_var.shape) / np.sqrt(fan_in)
    value_np = value_np.astype(np.float32)
    mg_var.assign(value_np)
    if th_path[0] == "query":
      # Model Garden multiplies the logits by 1/sqrt(d_k) at run time.
      value_np = value_np / np.float32(np.sqrt(KEY_DIM))
    th_var.assign(value_np)
  return mg, th


def _run(layer, query, value, key, mask, causal, training=False):
  output, scores = layer(query, value, key=key, attention_mask=mask,
                         use_causal_mask=causal, return_attention_scores=True,
                         training=training)
  return output.numpy(), scores.numpy()


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_model_garden(shape, mask_kind):
  rng = np.random.default_rng(0)
  query, value, key = _inputs(rng, shape)
  mask, causal = _mask(rng, mask_kind, value.shape[1])
  mg, th = _paired_layers(rng, query, value, key)

  want, want_scores = _run(mg, query, value, key, mask, causal)
  got, got_scores = _run(th, query, value, key, mask, causal)

  assert got.shape == want.shape == (BATCH, QUERY_LENGTH, WIDTH)
  assert got_scores.shape == want_scores.shape == (
      BATCH, NUM_HEADS, QUERY_LENGTH, value.shape[1])
  # Two float32 layers doing the same arithmetic in different orders.
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-5)
  # The comparison has teeth: the output is not near zero, and the mask did
  # act. P_w mixes heads, never positions, so masked weights stay zero.
  assert np.max(np.abs(want)) > 0.1
  if mask is not None or causal:
    allowed = np.ones((BATCH, QUERY_LENGTH, value.shape[1]), bool)
    if mask is not None:
      allowed &= mask.numpy()
    if causal:
      allowed &= np.tril(np.ones((QUERY_LENGTH, value.shape[1]), bool))
    blocked = ~allowed[:, np.newaxis]
    np.testing.assert_array_equal(np.where(blocked, got_scores, 0.0), 0.0)


def test_query_scale_is_needed():
  """Without folding 1/sqrt(d_k) into P_q the layers disagree."""
  rng = np.random.default_rng(1)
  query, value, key = _inputs(rng, "cross")
  mg, th = _paired_layers(rng, query, value, key)
  th_query = _variable(th, ("query", "kernel"))
  th_query.assign(_variable(mg, ("query", "kernel")))
  want, _ = _run(mg, query, value, key, None, False)
  got, _ = _run(th, query, value, key, None, False)
  assert np.max(np.abs(got - want)) > 1e-3


def test_matches_model_garden_with_dropout_at_inference():
  """A dropout rate changes nothing when training=False, in either layer."""
  rng = np.random.default_rng(2)
  query, value, key = _inputs(rng, "cross")
  mask, causal = _mask(rng, "boolean", value.shape[1])
  mg, th = _paired_layers(rng, query, value, key, dropout=0.5)
  want, want_scores = _run(mg, query, value, key, mask, causal)
  got, got_scores = _run(th, query, value, key, mask, causal)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-5)
