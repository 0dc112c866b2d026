"""What both Keras front ends share: the equations, the checks, the axes.

`thattn.layers` (tf_keras) and `thattn.keras3` (Keras 3 on TensorFlow, JAX
and PyTorch) compute the same layers with the same weights. This module is
the one place for what they must agree on, in plain Python (no TensorFlow,
no Keras), so the Keras 3 front end can import it on any backend:

- the einsum equations, as fixed string constants in the letters of
  `thattn.core.dims`, each commented in the paper's named-dimension notation;
- the checks of the arguments the two front ends share;
- the shapes and logical axes of the talking-heads projections.

Front-end code computes with these constants (tf.einsum or keras.ops.einsum);
it does not write equations of its own.
"""

import functools
import math

from thattn.core import dims
from thattn.core import validation

# ---- the projections (Section 3.3 and 4) -------------------------------------
# Q[b, n, h_k, d_k] = einsum(X[b, n, d_X], P_q[d_X, h_k, d_k])
QUERY_PROJECTION = "bnd,dik->bnik"
# K[b, m, h_k, d_k] = einsum(M[b, m, d_M], P_k[d_M, h_k, d_k])
KEY_PROJECTION = "bme,eik->bmik"
# V[b, m, h_v, d_v] = einsum(M[b, m, d_M], P_v[d_M, h_v, d_v])
VALUE_PROJECTION = "bme,ejv->bmjv"
# Y[b, n, d_Y] = einsum(O[b, n, h_v, d_v], P_o[h_v, d_v, d_Y])
OUTPUT_PROJECTION = "bnjv,jvo->bno"
# The gate G[b, n, h_v, d_v] = sigmoid(einsum(X[b, n, d_X], P_g[d_X, h_v,
# d_v])), which multiplies O before the output projection (Keras 3's
# use_gate; the element-wise gate of Qiu et al., 2025).
GATE_PROJECTION = "bnd,djv->bnjv"
# Their head-wise gate: G[b, n, h_v] = sigmoid(einsum(X[b, n, d_X],
# P_g[d_X, h_v])), one scalar per head multiplying all of O[b, n, h_v, :].
HEADWISE_GATE_PROJECTION = "bnd,dj->bnj"
# J[b, h_k, n, m] = einsum(Q[b, n, h_k, d_k], K[b, m, h_k, d_k])
DOT_PRODUCT = "bnik,bmik->binm"
# O[b, n, h_v, d_v] = einsum(U[b, h_v, n, m], V[b, m, h_v, d_v])
WEIGHTED_VALUES = "bjnm,bmjv->bnjv"
# L[b, h, n, m] = einsum(J[b, h_k, n, m], P_l[h_k, h]); U likewise with P_w.
HEADS_MIX = "bfnm,fg->bgnm"
# The same with G head groups, P_l as its blocks [G, h_k/G, h/G].
GROUPED_HEADS_MIX = "bgfnm,gfh->bghnm"

# ---- dynamic projections (Appendix A) ----------------------------------------
DYNAMIC_PROJECTIONS = ("x2l", "m2l", "x2w", "m2w")
# Appendix A adds the "l" terms to the static P_l and the "w" terms to P_w.
STATIC_PROJECTION = {"x2l": ("P_l", "project_logits"),
                     "m2l": ("P_l", "project_logits"),
                     "x2w": ("P_w", "project_weights"),
                     "m2w": ("P_w", "project_weights")}
# The input each dynamic projection is generated from: the queries X, or
# the memory M as the key input (m2l) and the value input (m2w).
DYNAMIC_SOURCES = {"x2l": "query", "x2w": "query", "m2l": "key",
                   "m2w": "value"}
# The paper (Appendix A) trained well only with small initial dynamic
# projections: normal with stddev 0.1 / sqrt(fan_in).
DYNAMIC_INIT_SCALE = 0.1
# R_Xl[b, n, h_k, h] = einsum(X[b, n, d_X], P_Xl[d_X, h_k, h]), and so on.
DYNAMIC_GENERATORS = {
    "x2l": "bnd,dih->bnih",
    "m2l": "bme,eih->bmih",
    "x2w": "bnd,dhj->bnhj",
    "m2w": "bme,ehj->bmhj",
}
# Grouped: R_Xl[b, n, g, i, h] = einsum(X[b, n, d_X], P_Xl[d_X, g, i, h]), ...
GROUPED_DYNAMIC_GENERATORS = {
    "x2l": "bnd,dgih->bngih",
    "m2l": "bme,egih->bmgih",
    "x2w": "bnd,dghj->bnghj",
    "m2w": "bme,eghj->bmghj",
}
DYNAMIC_MIXES = {
    # L[b, h, n, m] += einsum(J[b, h_k, n, m], R_Xl[b, n, h_k, h])
    "x2l": "binm,bnih->bhnm",
    # L[b, h, n, m] += einsum(J[b, h_k, n, m], R_Ml[b, m, h_k, h])
    "m2l": "binm,bmih->bhnm",
    # U[b, h_v, n, m] += einsum(W[b, h, n, m], R_Xw[b, n, h, h_v])
    "x2w": "bhnm,bnhj->bjnm",
    # U[b, h_v, n, m] += einsum(W[b, h, n, m], R_Mw[b, m, h, h_v])
    "m2w": "bhnm,bmhj->bjnm",
}
# The same four with G head groups (i, h, j count heads within a group).
GROUPED_DYNAMIC_MIXES = {
    # L[b, g, h, n, m] += einsum(J[b, g, i, n, m], R_Xl[b, n, g, i, h])
    "x2l": "bginm,bngih->bghnm",
    # L[b, g, h, n, m] += einsum(J[b, g, i, n, m], R_Ml[b, m, g, i, h])
    "m2l": "bginm,bmgih->bghnm",
    # U[b, g, j, n, m] += einsum(W[b, g, h, n, m], R_Xw[b, n, g, h, j])
    "x2w": "bghnm,bnghj->bgjnm",
    # U[b, g, j, n, m] += einsum(W[b, g, h, n, m], R_Mw[b, m, g, h, j])
    "m2w": "bghnm,bmghj->bgjnm",
}

# ---- general bilinear attention (Section 6) ----------------------------------
# XP[b, n, h, d_M] = einsum(X[b, n, d_X], P[d_X, d_M, h])
QUERY_BILINEAR = "bnd,deh->bnhe"
# L[b, h, n, m] = einsum(XP[b, n, h, d_M], M[b, m, d_M])
BILINEAR_LOGITS = "bnhe,bme->bhnm"
# WM[b, n, h, d_M] = einsum(W[b, h, n, m], M[b, m, d_M])
WEIGHTED_MEMORY = "bhnm,bme->bnhe"
# Y[b, n, d_Y] = einsum(WM[b, n, h, d_M], Q[d_M, d_Y, h])
BILINEAR_OUTPUT = "bnhe,eoh->bno"

# ---- masks and caches -------------------------------------------------------
# Added to the logits of positions that may not be attended. Softmax always
# runs in float32, so this never overflows a float16 or bfloat16 tensor, and
# a fully masked row becomes a uniform distribution rather than NaN.
MASKED_LOGIT = -1e9
# The decoding-cache write, over the cache's trailing dimensions flattened:
# written[b, m, x] = einsum(update[b, s, x], one_hot[s, m]), for the s new
# steps and the m cache (memory) positions.
CACHE_WRITE = "bsx,sm->bmx"

# ---- logical axes of the weights (thattn.core.dims) --------------------------------
PROJECTION_AXES = {
    "query": {"kernel": (dims.D_MODEL, dims.KEY_HEADS, dims.D_K),
              "bias": (dims.KEY_HEADS, dims.D_K)},
    "key": {"kernel": (dims.D_MODEL, dims.KEY_HEADS, dims.D_K),
            "bias": (dims.KEY_HEADS, dims.D_K)},
    "value": {"kernel": (dims.D_MODEL, dims.VALUE_HEADS, dims.D_V),
              "bias": (dims.VALUE_HEADS, dims.D_V)},
    "output": {"kernel": (dims.VALUE_HEADS, dims.D_V, dims.D_MODEL),
               "bias": (dims.D_MODEL,)},
    # The gate (keras.layers.MultiHeadAttention's use_gate).
    "gate": {"kernel": (dims.D_MODEL, dims.VALUE_HEADS, dims.D_V),
             "bias": (dims.VALUE_HEADS, dims.D_V)},
}
HEADWISE_GATE_AXES = {"kernel": (dims.D_MODEL, dims.VALUE_HEADS),
                      "bias": (dims.VALUE_HEADS,)}
BILINEAR_AXES = {"bilinear_p": (dims.D_MODEL, dims.D_K, dims.HEADS),
                 "bilinear_q": (dims.D_V, dims.D_MODEL, dims.HEADS)}
RELATIVE_BIAS_AXES = (dims.RELATIVE_BUCKETS, dims.HEADS)


def checked_dynamic_projections(dynamic_projections, *, project_logits=True,
                                project_weights=True, owner=None):
  """The dynamic projection names in the order of DYNAMIC_PROJECTIONS.

  The one check of a `dynamic_projections` argument, for both front ends
  and `thattn.models.config.AttentionConfig`. Raises ValueError when it is
  a string rather than a list, names a projection that does not exist, or
  names one whose static projection is off: each is added to P_l ("x2l",
  "m2l") or P_w ("x2w", "m2w"), so it needs `project_logits` or
  `project_weights`. `owner` is prefixed to the message.
  """
  prefix = f"{owner}: " if owner else ""
  if isinstance(dynamic_projections, str):
    raise ValueError(
        f"{prefix}dynamic_projections must be a list of names from "
        f"{DYNAMIC_PROJECTIONS}, got the string {dynamic_projections!r}; "
        f"write [{dynamic_projections!r}].")
  names = tuple(dynamic_projections)
  unknown = sorted(set(names) - set(DYNAMIC_PROJECTIONS))
  if unknown:
    unknown_names = f"{owner}: unknown" if owner else "Unknown"
    raise ValueError(f"{unknown_names} dynamic projections {unknown}; "
                     f"expected a subset of {DYNAMIC_PROJECTIONS}.")
  static_on = {"project_logits": project_logits,
               "project_weights": project_weights}
  for name in names:
    static, flag = STATIC_PROJECTION[name]
    if not static_on[flag]:
      raise ValueError(
          f"{prefix}dynamic projection {name!r} is added to the static "
          f"{static}, so it needs {flag}=True, got {flag}=False.")
  return tuple(name for name in DYNAMIC_PROJECTIONS if name in names)


def checked_heads(num_heads, num_key_heads, num_value_heads, project_logits,
                  project_weights):
  """(h_k, h, h_v) with h_k and h_v defaulting to h; ValueError if a
  projection is off while its two heads dimensions differ."""
  num_key_heads = num_heads if num_key_heads is None else num_key_heads
  num_value_heads = num_heads if num_value_heads is None else num_value_heads
  for name, value in (("num_heads", num_heads),
                      ("num_key_heads", num_key_heads),
                      ("num_value_heads", num_value_heads)):
    validation.layer_int(name, value)
  if not project_logits and num_key_heads != num_heads:
    raise ValueError(
        f"project_logits=False needs num_key_heads == num_heads, got "
        f"num_key_heads={num_key_heads}, num_heads={num_heads}.")
  if not project_weights and num_value_heads != num_heads:
    raise ValueError(
        f"project_weights=False needs num_value_heads == num_heads, got "
        f"num_value_heads={num_value_heads}, num_heads={num_heads}.")
  return num_key_heads, num_heads, num_value_heads


def checked_groups(num_head_groups, num_key_heads, num_heads,
                   num_value_heads):
  """G if it divides h_k, h and h_v; ValueError naming the ones it doesn't."""
  validation.layer_int("num_head_groups", num_head_groups)
  sizes = {"num_key_heads": num_key_heads, "num_heads": num_heads,
           "num_value_heads": num_value_heads}
  indivisible = {name: size for name, size in sizes.items()
                 if size % num_head_groups}
  if indivisible:
    raise ValueError(
        f"num_head_groups={num_head_groups} must divide num_key_heads, "
        f"num_heads and num_value_heads, got "
        + ", ".join(f"{name}={size}" for name, size in sizes.items())
        + f" ({', '.join(indivisible)} not divisible by {num_head_groups}).")
  return num_head_groups


def checked_key_value_heads(owner, num_key_value_heads, num_key_heads,
                            num_value_heads):
  """h_kv, the heads P_k and P_v project to (grouped-query attention, as in
  `keras.layers.GroupQueryAttention` and Llama), if it divides h_k and
  h_v: key head i reads K head i // (h_k / h_kv), value head j V head
  j // (h_v / h_kv). None: as many as h_k and h_v (no sharing)."""
  if num_key_value_heads is None:
    return None
  validation.layer_int("num_key_value_heads", num_key_value_heads)
  sizes = {"num_key_heads": num_key_heads, "num_value_heads": num_value_heads}
  indivisible = [name for name, size in sizes.items()
                 if size % num_key_value_heads]
  if indivisible:
    raise ValueError(
        f"{owner}: num_key_value_heads={num_key_value_heads} must divide "
        + " and ".join(f"{name}={size}" for name, size in sizes.items())
        + f" (each of those heads reads one of the {num_key_value_heads} "
        f"projected key and value heads); not a multiple of "
        f"{num_key_value_heads}: " + ", ".join(indivisible) + ".")
  return num_key_value_heads


def generate_dynamic(generators, **inputs):
  """{name: R} from `generators` ({name: callable}) whose source is given.

  `inputs` are some of query=, key=, value= (DYNAMIC_SOURCES), so a layer's
  query projection passes the queries and its memory projection the memory.
  """
  return {name: generator(inputs[DYNAMIC_SOURCES[name]])
          for name, generator in generators.items()
          if DYNAMIC_SOURCES[name] in inputs}


def dynamic_terms(names, query_state, memory_state):
  """{name: R[b, n or m, ...]} of `names` from a call's projected states."""
  states = {"query": query_state, "key": memory_state, "value": memory_state}
  return {name: states[DYNAMIC_SOURCES[name]][name] for name in names
          if name in states[DYNAMIC_SOURCES[name]]}


def mixed_scores(scores, static_projection, dynamic_names, query_state,
                 memory_state, *, groups, mix_heads, dynamic_mix):
  """The projected layers' hooks around the softmax, written once:

      L[b, h, n, m]   = J[b, h_k, n, m] P_l (+ the x2l, m2l terms)
      U[b, h_v, n, m] = W[b, h, n, m] P_w (+ the x2w, m2w terms)

  `scores` mixed across heads by `static_projection` (None: the identity,
  multi-head attention) through the front end's `mix_heads(scores, P)`,
  plus each dynamic term of `dynamic_names` (the query's, the memory's)
  that this call generated, through `dynamic_mix(name, scores, R, groups)`
  (R from the projected states; see `generate_dynamic`)."""
  mixed = (scores if static_projection is None else
           mix_heads(scores, static_projection))
  for name, state in zip(dynamic_names, (query_state, memory_state)):
    if name in state:
      mixed = mixed + dynamic_mix(name, scores, state[name], groups)
  return mixed


def fixed_head_size(sequence_length, head_size):
  """d_k = d_v of Bhojanapalli et al.'s fixed head size: n, or head_size."""
  if (sequence_length is None) == (head_size is None):
    raise ValueError("Give exactly one of sequence_length and head_size, got "
                     f"sequence_length={sequence_length!r}, "
                     f"head_size={head_size!r}.")
  return sequence_length if head_size is None else head_size


def combine_masks(logical_and, masks):
  """Logical AND (a framework's `logical_and`) of the masks that are not
  None; None if all are None."""
  present = [mask for mask in masks if mask is not None]
  return functools.reduce(logical_and, present) if present else None


def check_one_memory(owner, key_width, value_width):
  """General bilinear attention reads one memory M: its keys and values
  must have one width."""
  if key_width != value_width:
    raise ValueError(
        f"{owner}: general bilinear attention reads one memory M, so key "
        f"and value must have the same width, got key width {key_width} "
        f"and value width {value_width}.")


def check_relative_buckets(bidirectional, num_buckets, max_distance):
  """T5's bucketing needs 2 buckets (4 bidirectional) and a distance > 0."""
  if num_buckets < 2 or (bidirectional and num_buckets < 4):
    raise ValueError(f"num_buckets={num_buckets} is too small; expected at "
                     "least 4 for bidirectional and 2 for unidirectional.")
  if max_distance <= 0:
    raise ValueError(f"max_distance must be positive, got {max_distance}.")


def talking_heads_config(layer):
  """The talking-heads arguments of `layer`'s config, as both front ends
  write them (the initializer, serialized by each Keras, aside)."""
  return {
      "num_heads": layer.num_heads,
      "num_key_heads": layer.num_key_heads,
      "num_value_heads": layer.num_value_heads,
      "project_logits": layer.project_logits,
      "project_weights": layer.project_weights,
      "dynamic_projections": list(layer.dynamic_projections),
      "num_head_groups": layer.num_head_groups,
      "fused_kernel": layer.fused_kernel,
  }


def projected_options_config(layer):
  """`num_key_value_heads`, the rotary arguments and
  `query_key_norm_epsilon` of a projected layer's config, as both front
  ends write them: only those set, so that other layers' configs stay as
  they were (and load in an earlier thattn)."""
  config = {}
  if layer.num_key_value_heads is not None:
    config["num_key_value_heads"] = layer.num_key_value_heads
  if layer.rotary_base is not None:
    config.update(rotary_base=layer.rotary_base, rotary_pct=layer.rotary_pct,
                  rotary_scaling=layer.rotary_scaling)
  if layer.query_key_norm_epsilon is not None:
    config["query_key_norm_epsilon"] = layer.query_key_norm_epsilon
  return config


def checked_query_key_norm(owner, epsilon):
  """`query_key_norm_epsilon`: None (no norm) or a positive float."""
  if epsilon is None:
    return None
  if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or (
      epsilon <= 0):
    raise ValueError(f"{owner}: query_key_norm_epsilon must be None (no "
                     "norm of the queries and keys) or a positive number, "
                     f"got {epsilon!r}.")
  return float(epsilon)


class MixingShapes:
  """Shapes, logical axes and fan-in of the P_l-like and P_w-like weights.

  Kind "l" maps h_k heads to h (P_l, P_Xl, P_Ml) and kind "w" maps h to h_v
  (P_w, P_Xw, P_Mw). The dynamic generators put d_model in front.
  """

  def __init__(self, h_k, h, h_v, groups):
    self.groups = groups
    self.heads = {"l": (h_k, h), "w": (h, h_v)}

  def static(self, kind):
    """(shape, logical axes) of P_l (kind "l") or P_w (kind "w")."""
    heads_in, heads_out = self.heads[kind]
    if self.groups == 1:
      axes = {"l": (dims.KEY_HEADS, dims.HEADS),
              "w": (dims.HEADS, dims.VALUE_HEADS)}[kind]
      return [heads_in, heads_out], axes
    axes = {"l": (dims.HEAD_GROUPS, dims.KEY_HEADS_PER_GROUP,
                  dims.HEADS_PER_GROUP),
            "w": (dims.HEAD_GROUPS, dims.HEADS_PER_GROUP,
                  dims.VALUE_HEADS_PER_GROUP)}[kind]
    return ([self.groups, heads_in // self.groups,
             heads_out // self.groups], axes)

  def fan_in(self, kind):
    """Heads each output head sums over: h_k/G for "l", h/G for "w"."""
    return self.heads[kind][0] // self.groups


# ---- the output gate (Qiu et al., 2025; keras.layers.MultiHeadAttention's
# use_gate) ---------------------------------------------------------------------
def checked_gate(owner, use_gate, headwise_gate):
  """(use_gate, headwise_gate), both bools, a head-wise gate only with a
  gate."""
  for name, value in (("use_gate", use_gate),
                      ("headwise_gate", headwise_gate)):
    if not isinstance(value, bool):
      raise ValueError(f"{owner}: `{name}` must be True or False. Received: "
                       f"{name}={value!r}")
  if headwise_gate and not use_gate:
    raise ValueError(f"{owner}: headwise_gate=True says how the gate is "
                     "shaped, so it needs use_gate=True; got use_gate=False.")
  return use_gate, headwise_gate


def gate_projection(heads, width, headwise):
  """P_g for a context O[b, n, heads, width]: (its einsum equation, its
  output shape after b, {"kernel", "bias": logical axes}, the bias's
  letters). Element-wise, G[b, n, heads, width]; head-wise, G[b, n,
  heads]."""
  if headwise:
    return (HEADWISE_GATE_PROJECTION, (None, heads), HEADWISE_GATE_AXES,
            "j")
  return GATE_PROJECTION, (None, heads, width), PROJECTION_AXES["gate"], "jv"


# ---- differential attention (Ye et al., 2024; transformers' DiffLlama) ------
def checked_differential_heads(owner, num_heads, key_dim, value_dim,
                               num_key_value_heads):
  """(N, K, N_kv) of a differential attention layer: N maps, even, since
  map j pairs with map j + N/2; each map's values as wide as its keys
  (`value_dim` None or K); N_kv None or a divisor of N."""
  maps = validation.layer_int("num_heads", num_heads, owner=owner)
  key_dim = validation.layer_int("key_dim", key_dim, owner=owner)
  if maps % 2:
    raise ValueError(
        f"{owner}: differential attention pairs softmax map j with map "
        f"j + N/2, so num_heads (N) must be even; got num_heads={maps}.")
  if value_dim is not None and value_dim != key_dim:
    raise ValueError(
        f"{owner}: each map's values are as wide as its keys (DiffLlama's "
        f"head_dim), so value_dim must be None or key_dim={key_dim}; got "
        f"value_dim={value_dim}.")
  heads_kv = validation.positive_int(
      "num_key_value_heads", num_key_value_heads, owner=owner, optional=True)
  if heads_kv is not None and maps % heads_kv:
    raise ValueError(
        f"{owner}: num_key_value_heads={heads_kv} must divide num_heads="
        f"{maps} (each key and value head serves N / N_kv maps).")
  return maps, key_dim, heads_kv


def check_call(owner, value, cache, decode_step, sliding_window):
  """A layer call's memory, cache and decoding step, as both fronts take
  them: a memory unless a cross-attention cache stands for it, a cache
  for a decoding step, and no sliding window over a cross-attention
  cache (whose step passes no query position)."""
  if value is None and cache is None:
    raise ValueError(f"{owner}: `value` (the memory) is required unless a "
                     "cross-attention `cache` is given.")
  if decode_step is not None and cache is None:
    raise ValueError(f"{owner}: decode_step={decode_step!r} needs a cache; "
                     "create one with `initial_cache`.")
  if cache is not None and decode_step is None and sliding_window is not None:
    raise ValueError(
        f"{owner}: sliding_window={sliding_window} with a cross-attention "
        "cache: the window needs each query's position, which a "
        "cross-attention decoding step does not pass; use "
        "sliding_window=None for cross-attention.")


# ---- DCMHA (thattn.ops.dcmha) ------------------------------------------------
# Its kernels, in the order both fronts make them (after P_q..P_o): D_1[d,
# 4, C], Q_kw[4, C, 2R, h] and D_d[d, 4, h], the 4-axis the slots pre/query,
# pre/key, post/query, post/key; then, with `static_mix`, S[2, h, h].
COMPOSE_KERNELS = ("dynamic_hidden", "dynamic_factors", "dynamic_gates")
STATIC_MIX = "static_mix"
# The query state's and memory state's names for a side's dynamic weights
# (w_1, w_2, g), and for the keys' mixing matrices a decoding cache keeps.
QUERY_COMPOSE_FACTORS = ("query_w1", "query_w2", "query_gates")
KEY_COMPOSE_FACTORS = ("key_w1", "key_w2", "key_gates")
KEY_COMPOSE_MIX = "key_mix"
# Every state entry beyond Q, K and V that a variant's `attend` reads, and
# its side: what Keras 3's `_compute_attention` carries as its
# `dynamic_projections` (thattn.keras3.conventions).
DYNAMIC_STATE_SIDES = {
    **{name: "query" if source == "query" else "memory"
       for name, source in DYNAMIC_SOURCES.items()},
    **{name: "query" for name in QUERY_COMPOSE_FACTORS},
    **{name: "memory" for name in KEY_COMPOSE_FACTORS + (KEY_COMPOSE_MIX,)}}


def checked_dynamic_compose(owner, num_heads, rank, hidden_dim):
  """(R, C) of a DCMHA layer: R a positive int, C one too or None (the
  authors' 2 R h)."""
  heads = validation.layer_int("num_heads", num_heads, owner=owner)
  rank = validation.positive_int("dynamic_rank", rank, owner=owner)
  hidden_dim = validation.positive_int("dynamic_hidden_dim", hidden_dim,
                                       owner=owner, optional=True)
  return rank, hidden_dim or 2 * rank * heads


def check_compose_widths(owner, query_width, key_width):
  """DCMHA's one set of dynamic kernels reads X for the queries' slots and
  M for the keys': their widths must agree."""
  if query_width != key_width:
    raise ValueError(
        f"{owner}: DCMHA generates the queries' dynamic weights from the "
        f"query (width {query_width}) and the keys' from the key input "
        f"(width {key_width}) with the same kernels, so the widths must be "
        "equal.")


def compose_stddev(name, shape):
  """The normal initializer's stddev of the DCMHA weight `name` of
  `shape`, as the authors' MaxText DCFormer draws it: small, so that a
  model starts near multi-head attention."""
  if name == COMPOSE_KERNELS[0]:  # D_1[d, 4, C]
    return math.sqrt(2.0 / (shape[0] + shape[2]))
  if name == COMPOSE_KERNELS[1]:  # Q_kw[4, C, 2R, h]
    return (math.sqrt(1.0 / shape[1]) * 2.0 / (shape[3] + shape[2] // 2) *
            0.01)
  if name == COMPOSE_KERNELS[2]:  # D_d[d, 4, h]
    return math.sqrt(2.0 / (shape[0] + shape[2])) * 0.005
  return 0.1 * math.sqrt(1.0 / shape[-1])  # S[2, h, h]


def compose_weights(width, num_heads, rank, hidden_dim, static_mix):
  """(name, shape, logical axes, initializer stddev) of each DCMHA weight,
  in the order both fronts make them (`compose_stddev`)."""
  weights = [
      (COMPOSE_KERNELS[0], (width, 4, hidden_dim),
       (dims.D_MODEL, dims.COMPOSE_SLOTS, dims.DYNAMIC_HIDDEN)),
      (COMPOSE_KERNELS[1], (4, hidden_dim, 2 * rank, num_heads),
       (dims.COMPOSE_SLOTS, dims.DYNAMIC_HIDDEN, dims.DYNAMIC_RANK,
        dims.HEADS)),
      (COMPOSE_KERNELS[2], (width, 4, num_heads),
       (dims.D_MODEL, dims.COMPOSE_SLOTS, dims.HEADS))]
  if static_mix:
    weights.append((STATIC_MIX, (2, num_heads, num_heads),
                    (dims.COMPOSE_STAGES, dims.KEY_HEADS, dims.HEADS)))
  return [(name, shape, axes, compose_stddev(name, shape))
          for name, shape, axes in weights]


# ---- tf_keras's argument conventions -------------------------------------------
def resolve_alias(owner, canonical, alias, default):
  """(name, value) of a canonical argument or its older alias, as given.

  `canonical` and `alias` are (name, value) pairs; an alias is "given" when
  its value is not None, the canonical when its value differs from
  `default`. The name returned is the one the caller used, for error
  messages. Raises ValueError naming both when both are given and differ.
  """
  (name, value), (alias_name, alias_value) = canonical, alias
  if alias_value is None:
    return name, value
  if value != default and value != alias_value:
    raise ValueError(
        f"{owner}: {name}={value!r} and its alias {alias_name}="
        f"{alias_value!r} disagree; pass only {name}.")
  return alias_name, alias_value


def output_width(owner, output_shape):
  """d_Y from tf_keras's `output_shape` (an int or a 1-tuple), or None.

  tf_keras also allows longer tuples (an output of rank > 3); thattn's
  layers produce Y[b, n, d_Y] only, so those are refused.
  """
  if output_shape is None or isinstance(output_shape, int):
    return output_shape
  if isinstance(output_shape, (tuple, list)) and len(output_shape) == 1:
    return output_shape[0]
  raise ValueError(
      f"{owner}: Invalid `output_shape`: {output_shape!r}. thattn's layers "
      "output [batch, length, d_Y], so output_shape must be an int d_Y or a "
      "1-tuple (d_Y,).")


# tf_keras's `attention_axes` values that mean thattn's only layout, rank-3
# inputs [b, n, d] attended over axis 1.
_SEQUENCE_AXES = (None, 1, -2, (1,), (-2,), [1], [-2])


def check_attention_axes(owner, attention_axes):
  """Accepts tf_keras's `attention_axes` only where it means thattn's layout."""
  if attention_axes not in _SEQUENCE_AXES:
    raise ValueError(
        f"{owner}: attention_axes={attention_axes!r} is not supported; "
        "thattn's layers take [batch, length, width] inputs and attend over "
        "the length axis (attention_axes=None or (1,)). Reshape other axes "
        "into the batch or length axis.")


def check_memory_shapes(owner, value_shape, key_shape):
  """Keras's check of `compute_output_shape` and `build`: key and value
  agree in every dimension but the width."""
  value_shape, key_shape = tuple(value_shape), tuple(key_shape)
  if value_shape[1:-1] != key_shape[1:-1]:
    raise ValueError(
        f"{owner}: All dimensions of `value` and `key`, except the last one, "
        f"must be equal. Received: value_shape={value_shape} and "
        f"key_shape={key_shape} (both are the memory M[b, m, ...]).")


def check_lengths(owner, shapes):
  """Refuses inputs whose batch or memory lengths disagree (static shapes).

  `shapes` maps "query", "key", "value" to shapes as lists (None for an
  unknown size) or None. Without this, a mismatch fails inside an einsum of
  the attention core with a message that names no input.
  """
  shapes = {name: list(shape) for name, shape in shapes.items()
            if shape is not None and len(shape) == 3}
  batches = {name: shape[0] for name, shape in shapes.items()
             if shape[0] is not None}
  if len(set(batches.values())) > 1:
    raise ValueError(
        f"{owner}: query, key and value must have the same batch size, got "
        "shapes " + ", ".join(f"{name} {tuple(shapes[name])}"
                              for name in batches) + ".")
  key_length, value_length = (shapes.get(name, [None, None])[1]
                              for name in ("key", "value"))
  if None not in (key_length, value_length) and key_length != value_length:
    raise ValueError(
        f"{owner}: All dimensions of `value` and `key`, except the last one, "
        f"must be equal. Received: value_shape={tuple(shapes['value'])} and "
        f"key_shape={tuple(shapes['key'])} (both are the memory "
        "M[b, m, ...], so their lengths must agree).")
