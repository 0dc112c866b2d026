"""Multi-head attention on cuDNN's fused kernel, through JAX, on NVIDIA GPUs.

`keras.ops.dot_product_attention` on JAX passes a mask to cuDNN as an
additive bias of the mask's own shape, and cuDNN's layout check wants a
bias of the full [*, *, n, m]: BERT's padding mask [b, 1, 1, m] is refused
("Bias must have same seq length as QKV, got 1 and 512"), Keras logs the
traceback and computes the call with XLA's attention instead, on every call.
Here thattn asks first, then calls `jax.nn.dot_product_attention` itself,
with the masks in the forms cuDNN takes:

- a key mask [b or 1, 1, 1, m] (BERT's and T5's padding) as key lengths
  (`key_value_seq_lengths`), which also lets cuDNN skip the padded tiles.
  Lengths mean "the first L keys", and any key mask becomes such a prefix
  once each row's allowed keys are moved to the front: without a causal
  mask or a bias, attention does not depend on the keys' order, so K and V
  are permuted that way (the identity for BERT's padding) and no branch is
  taken. A row with no key at all is uniform over every key, as in the
  keras.ops core. With a causal mask or a bias, positions matter: a mask
  that is not a prefix goes to XLA's attention with the mask itself, by a
  `lax.cond` on the mask's values, decided each call (XLA's GPU runtime
  copies a cond's predicate to the host and waits for it, outside CUDA
  graphs: one reason to take no branch where none is needed);
- a causal mask at offset 0 as `is_causal` (with key lengths too, cuDNN's
  padding-causal mask);
- T5's position bias [1 or b, h, n, m] as the bias.

`obstacle` names what cuDNN cannot take, from the conditions JAX's cuDNN
path checks before it builds the call (`jax._src.cudnn.
fused_attention_stablehlo`: `check_layout`, `check_is_flash_attention`;
tests/keras3/gpu_paths_checks.py holds thattn's conditions against them). Such a
call runs on thattn's keras.ops core, chosen before the call: nothing is
tried and logged.

Letters as in `thattn.core.dims`: Q[b, n, h, d], K and V [b, m, h, d] (BTNH).
"""

import functools

import keras

# Where a key mask goes to cuDNN as lengths, the call makes it a prefix
# of each row (REORDER_KEYS), or checks on the device that it is one. False
# trusts the lengths: only for measuring what that costs
# (benchmarks/model_steps.py).
VERIFY_PREFIX = True
# Without a causal mask or a bias, the allowed keys are moved to the front
# (no branch); False takes the prefix check's lax.cond there too: only for
# measuring one against the other (benchmarks/model_steps.py).
REORDER_KEYS = True


def available():
  """Whether Keras runs on JAX on an NVIDIA GPU, where cuDNN's attention
  is."""
  if keras.backend.backend() != "jax":
    return False
  import jax  # pylint: disable=g-import-not-at-top
  if jax.default_backend() != "gpu":
    return False
  return "cuda" in jax.devices()[0].client.platform_version.lower()


def max_head_dim():
  """cuDNN's largest head size: 256 from Hopper (compute capability 9.0)
  on, else 128 (JAX's check_is_flash_attention)."""
  import jax  # pylint: disable=g-import-not-at-top
  capability = getattr(jax.devices()[0], "compute_capability", "0.0")
  major = int(str(capability).split(".", maxsplit=1)[0])
  return 256 if major >= 9 else 128


def is_key_mask(mask):
  """Whether a mask [b or 1, h or 1, n or 1, m] depends on the key alone."""
  return len(mask.shape) == 4 and mask.shape[1] == 1 and mask.shape[2] == 1


def obstacle(query, key, value, bias=None, mask=None, causal_offset=None,
             head_dim_limit=256):
  """Why cuDNN's attention cannot compute this call, or None.

  `mask` is thattn's boolean mask [b or 1, h or 1, n or 1, m] (None: no
  mask), `causal_offset` the causal mask's offset (None: not causal),
  `head_dim_limit` `max_head_dim()` on the device.
  """
  dtypes = {str(keras.backend.standardize_dtype(t.dtype))
            for t in (query, key, value)}
  if len(dtypes) != 1 or not dtypes <= {"bfloat16", "float16"}:
    return (f"cuDNN's attention computes float16 or bfloat16 Q, K, V of one "
            f"dtype, got {sorted(dtypes)}")
  _, length, heads, key_dim = query.shape
  memory = key.shape[1]
  if value.shape[-1] != key_dim:
    return (f"cuDNN's attention here needs d_k == d_v, got {key_dim} and "
            f"{value.shape[-1]}")
  if key_dim > head_dim_limit or key_dim % 8:
    return (f"cuDNN's attention needs a head size that is a multiple of 8 "
            f"and at most {head_dim_limit}, got {key_dim}")
  if heads % key.shape[2] or key.shape[2] != value.shape[2]:
    return (f"cuDNN's attention needs as many key as value heads, dividing "
            f"the query heads, got {heads}, {key.shape[2]} and "
            f"{value.shape[2]}")
  if causal_offset is not None and not (isinstance(causal_offset, int) and
                                        causal_offset == 0):
    return ("cuDNN's causal mask starts at position 0, and this call's "
            f"offset is {causal_offset!r}")
  if mask is not None and not is_key_mask(mask):
    return ("cuDNN's attention takes a key mask [b, 1, 1, m] (as key "
            f"lengths), got a mask of shape {tuple(mask.shape)}")
  if bias is not None:
    if len(bias.shape) != 4 or tuple(bias.shape[2:]) != (length, memory):
      return (f"cuDNN's attention takes a bias [b or 1, h or 1, {length}, "
              f"{memory}], got shape {tuple(bias.shape)}")
    if length % 2 or memory % 2:
      # JAX refuses a bias's gradient at odd lengths; the forward pass
      # alone would run, but whether a gradient follows is not known here.
      return (f"cuDNN's attention with a bias needs even lengths, got n = "
              f"{length} and m = {memory}")
  return None


def attention(query, key, value, bias=None, mask=None, causal_offset=None,
              implementation="cudnn"):
  """O[b, n, h, d] = softmax(Q K^T + bias, masked) V on cuDNN (scale 1: P_q
  holds 1/sqrt(d_k)), for a call `obstacle` accepts. `implementation=
  "xla"` computes the same calls (key lengths, the reordered keys, the
  prefix check) with XLA's attention, which is how a CPU tests them."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  is_causal = causal_offset is not None
  if bias is not None:
    bias = bias.astype(query.dtype)

  def on_cudnn(lengths):
    return jax.nn.dot_product_attention(
        query, key, value, bias=bias, key_value_seq_lengths=lengths,
        scale=1.0, is_causal=is_causal, implementation=implementation)

  if mask is None:
    return on_cudnn(None)
  key_mask = jnp.broadcast_to(mask[:, 0, 0, :],
                              (query.shape[0], key.shape[1]))
  lengths = jnp.sum(key_mask, axis=-1, dtype=jnp.int32)
  if not VERIFY_PREFIX:
    return on_cudnn(lengths)
  if REORDER_KEYS and bias is None and not is_causal:
    return _on_allowed_keys_first(query, key, value, key_mask, lengths,
                                  implementation)
  positions = jnp.arange(key.shape[1], dtype=jnp.int32)
  is_prefix = jnp.logical_and(
      jnp.all(key_mask == (positions < lengths[:, None])),
      jnp.all(lengths > 0))

  def on_xla(_):
    return jax.nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, scale=1.0,
        is_causal=is_causal, implementation="xla")

  # Under a gradient, a cond's forward returns the residuals of both
  # branches, the branch not taken filling the other's with zeros. XLA's
  # attention keeps four [b, h, n, m] arrays (a mask, two float32, one
  # bfloat16: 11 bytes a score), so the cuDNN branch would write 1.1 GB of
  # zeros a layer at BERT-base (batch 32, n = 512) and hold them to the
  # backward pass. Recomputed instead, the fallback keeps only its inputs
  # (tests/keras3/gpu_paths_checks.py holds it).
  return jax.lax.cond(is_prefix, on_cudnn, jax.checkpoint(on_xla), lengths)


def _on_allowed_keys_first(query, key, value, key_mask, lengths,
                           implementation):
  """cuDNN's attention with key lengths for any key mask [b, m], no causal
  mask, no bias: each row's allowed keys (K and V at once) moved to the
  front in their order, the rest after them. A row with no allowed key
  gets the mean of V, what softmax over equally masked logits gives."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  # A stable sort of "masked?" puts the allowed keys first, in order.
  order = jnp.argsort(jnp.logical_not(key_mask), axis=-1, stable=True)
  inverse = jnp.argsort(order, axis=-1)
  empty = lengths == 0
  # cuDNN never sees a row of length 0; such a row attends to every key,
  # and its output (and so every gradient through it) is replaced below.
  lengths = jnp.where(empty, key.shape[1], lengths)
  key, value = _permute_keys(key, order, inverse), _permute_keys(
      value, order, inverse)
  attended = jax.nn.dot_product_attention(
      query, key, value, key_value_seq_lengths=lengths, scale=1.0,
      implementation=implementation)
  uniform = jnp.mean(value.astype(jnp.float32), axis=1, keepdims=True)
  return jnp.where(empty[:, None, None, None],
                   uniform.astype(attended.dtype), attended)


def _permute_keys(tensor, order, inverse):
  """tensor[b, order[b, j], ...] along the keys; its gradient is the same
  gather by the inverse order (a permutation: no scatter-add, which GPUs
  serialize for bfloat16)."""
  return _key_permutation()(tensor, order, inverse)


@functools.cache
def _key_permutation():
  """permute(x[b, m, ...], order[b, m], inverse[b, m]), made once (JAX is
  imported only where Keras runs on it)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def gather(x, index):
    return jnp.take_along_axis(
        x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)

  @jax.custom_vjp
  def permute(x, order, inverse):
    del inverse
    return gather(x, order)

  def forward(x, order, inverse):
    return gather(x, order), inverse

  def backward(inverse, cotangent):
    return gather(cotangent, inverse), None, None

  permute.defvjp(forward, backward)
  return permute
