"""Differential attention (Ye et al., 2024, "Differential Transformer"),
written once for both front ends over an ops namespace (`keras.ops`,
`thattn.ops.tf_ops.TF_OPS`), as transformers' DiffLlama computes it
(docs/family_sources.md, section 3). Letters follow `thattn.core.dims`;
N softmax maps of K channels each make N/2 differential heads:

    W[b, N, n, m]     = softmax(J[b, N, n, m])                (one per map)
    U[b, N/2, n, m]   = W[b, :N/2] - lambda W[b, N/2:]        (map j with j + N/2)
    V'[b, m, N/2, 2K] = concat(V[b, m, :N/2, K], V[b, m, N/2:, K])
    O[b, n, N/2, 2K]  = einsum(U, V')
    O'                = RMSNorm_2K(O) (1 - lambda_init)       (no learned scale)

with one lambda per layer, shared by its heads,

    lambda      = exp(sum(lambda_q1 lambda_k1)) - exp(sum(lambda_q2 lambda_k2))
                  + lambda_init
    lambda_init = 0.8 - 0.6 exp(-0.3 l)                       (l: 0-based layer)

U is a post-softmax head mix, P_w[N, N/2] = [I; -lambda I] in talking
heads' terms, fixed but for lambda.
"""

import math

# The four [K] vectors of lambda, in DiffLlama's order (its state dict's).
LAMBDA_WEIGHTS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def lambda_init(layer_index):
  """lambda_init of the layer at 0-based depth `layer_index` (DiffLlama's
  `lambda_init_fn`; the paper's 0.8 - 0.6 exp(-0.3 (l - 1)) with l from
  1)."""
  return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


def differential_lambda(ops, vectors, initial):
  """The layer's lambda, a float32 scalar, from its four [K] vectors
  ({name in LAMBDA_WEIGHTS: vector}), summed in float32 as DiffLlama
  does."""
  q1, k1, q2, k2 = (ops.cast(vectors[name], "float32")
                    for name in LAMBDA_WEIGHTS)
  return ops.exp(ops.sum(q1 * k1)) - ops.exp(ops.sum(q2 * k2)) + initial


def difference_of_maps(ops, weights, scale):
  """U[b, N/2, n, m] = W[b, :N/2] - scale W[b, N/2:] from W[b, N, n, m],
  in W's dtype."""
  half = weights.shape[1] // 2
  return weights[:, :half] - ops.cast(scale, weights.dtype) * weights[:, half:]


def attended_memory(ops, memory_state, repeats):
  """The memory state the core reads: K[b, m, N, K], each of the N_kv key
  heads repeated for its `repeats` maps, and V'[b, m, N/2, 2K], value
  head j (repeated likewise) beside value head j + N/2, from the state
  `project_memory` made (and a cache holds), with N_kv heads each."""
  key, value = memory_state["key"], memory_state["value"]
  if repeats > 1:
    key = ops.repeat(key, repeats, axis=2)
    value = ops.repeat(value, repeats, axis=2)
  half = value.shape[2] // 2
  paired = ops.concatenate([value[:, :, :half], value[:, :, half:]], axis=-1)
  return dict(memory_state, key=key, value=paired)


def normalized_heads(ops, context, epsilon, scale):
  """RMSNorm over each head's 2K channels of O[b, n, N/2, 2K], in float32,
  times `scale` (1 - lambda_init), in O's dtype."""
  wide = ops.cast(context, "float32")
  norm = ops.rsqrt(ops.mean(ops.square(wide), axis=-1, keepdims=True) +
                   epsilon)
  return ops.cast(wide * norm * scale, context.dtype)
