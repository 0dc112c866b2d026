"""Parameters and multiplies per attention layer, as in the paper's tables.

Pure Python, without TensorFlow, so `thattn-complexity` starts instantly.
Parameters count the projection tensors (plus the biases of P_q, P_k, P_v and
P_o with `use_bias`). Multiplies count the scalar multiplications of a naive
evaluation of each einsum in the paper's pseudocode; the softmax and additions
are free, as in the paper's Section 5. `PAPER_ROWS` carries the printed
numbers of Tables 1, 2, 3, 8 and 9 so that tests can hold the two together.
"""

import dataclasses
from typing import Optional, Tuple

from thattn.core import attention_spec
from thattn.core import validation
from thattn.core import variants

# The layers counted here, as `AttentionShape.variant` names them: each
# registered variant is counted as one of them with its options
# (`thattn.core.variants.Variant.counted_as`; `variant_shape`).
COUNTED_LAYERS = ("multi_head", "talking_heads", "general_bilinear",
                  "differential", "dcmha")
# Appendix A's dynamic projections, named as in `TalkingHeadsAttention`.
LOGITS_DYNAMIC = ("x2l", "m2l")  # P_Xl[d_X, h_k, h], P_Ml[d_M, h_k, h]
WEIGHTS_DYNAMIC = ("x2w", "m2w")  # P_Xw[d_X, h, h_v], P_Mw[d_M, h, h_v]
DYNAMIC_PROJECTIONS = LOGITS_DYNAMIC + WEIGHTS_DYNAMIC


@dataclasses.dataclass(frozen=True)
class AttentionShape:
  """The sizes of one attention layer, named as in the `thattn.layers` APIs.

  `variant` picks the layer: "multi_head" (`MultiHeadAttention`),
  "talking_heads" (`TalkingHeadsAttention`) or "general_bilinear"
  (`GeneralBilinearAttention`). The paper's "project logits" and "project
  weights" rows (Table 3) are talking_heads with `project_weights=False` or
  `project_logits=False`.

  `num_head_groups` (G) makes P_l[h_k, h] and P_w[h, h_v] block-diagonal with
  G blocks, so heads only talk within their group; it also applies to the
  dynamic projections. G=1 is the paper's talking heads. This is not in the
  paper; it is `TalkingHeadsAttention(num_head_groups=G)`, which stores only
  the blocks (tests/layers/head_groups_test.py checks the counts agree).

  Self-attention and the T5 encoder-decoder attention both have
  d_X = d_M = `d_model`; `output_dim` is d_Y and defaults to `d_model`.

  `num_key_value_heads` (h_kv, grouped-query attention: the layers'
  argument of that name) makes P_k and P_v project to h_kv heads, shared
  by the h_k key heads and the h_v value heads.

  `use_gate` adds the output gate of gated attention (Qiu et al., 2025;
  the layers' argument of that name): P_g[d_X, h_v, d_v], or P_g[d_X,
  h_v] with `headwise_gate`.

  "differential" (`DifferentialAttention`, Ye et al., 2024) has h softmax
  maps of size d_k (= d_v) paired into h/2 heads whose values are 2 d_k
  wide: the projections of multi-head attention with h heads, and the
  four lambda vectors [d_k].

  "dcmha" (`DynamicallyComposableAttention`, Xiao et al., 2024) is
  multi-head attention with the dynamic weights' kernels D_1[d_X, 4, C],
  Q_kw[4, C, 2R, h] and D_d[d_X, 4, h] (`dynamic_rank` R, 2 in the
  releases; `dynamic_hidden_dim` C, None for 2 R h), and with
  `static_mix` S[2, h, h].

  The properties `h_k`, `h`, `h_v`, `d_k`, `d_v` and `d_y` give the sizes in
  the paper's notation, with defaults resolved; `key_projection_heads` and
  `value_projection_heads` the heads of P_k and P_v.
  """
  variant: str
  num_heads: int
  key_dim: Optional[int] = None
  value_dim: Optional[int] = None
  num_key_heads: Optional[int] = None
  num_value_heads: Optional[int] = None
  project_logits: bool = True
  project_weights: bool = True
  dynamic_projections: Tuple[str, ...] = ()
  num_head_groups: int = 1
  use_bias: bool = False
  num_key_value_heads: Optional[int] = None
  use_gate: bool = False
  headwise_gate: bool = False
  dynamic_rank: int = 2
  dynamic_hidden_dim: Optional[int] = None
  static_mix: bool = False
  d_model: int = 768
  output_dim: Optional[int] = None
  query_length: int = 512
  memory_length: int = 512

  def __post_init__(self):
    # Accept any sequence (e.g. a list from a command-line flag) but store a
    # tuple, so shapes stay hashable and compare equal.
    object.__setattr__(self, "dynamic_projections",
                       tuple(self.dynamic_projections))
    _validate(self)

  # The sizes in the paper's notation, with defaults resolved. d_X = d_M =
  # d_model throughout: self-attention and T5's encoder-decoder attention.
  @property
  def h(self) -> int:
    return self.num_heads

  @property
  def h_k(self) -> int:
    return self.num_key_heads or self.num_heads

  @property
  def h_v(self) -> int:
    return self.num_value_heads or self.num_heads

  @property
  def key_projection_heads(self) -> int:
    """The heads P_k projects to: h_kv where shared, else h_k."""
    return self.num_key_value_heads or self.h_k

  @property
  def value_projection_heads(self) -> int:
    """The heads P_v projects to: h_kv where shared, else h_v."""
    return self.num_key_value_heads or self.h_v

  @property
  def d_k(self) -> int:
    # GBMA is multi-head attention whose keys and values are the memory
    # vectors themselves (P_k, P_v the identity), so d_k = d_v = d_M. Table 1
    # prints 768 for it.
    if self.variant == "general_bilinear":
      return self.d_model
    return self.key_dim

  @property
  def d_v(self) -> int:
    if self.variant == "general_bilinear":
      return self.d_model
    return self.value_dim or self.key_dim

  @property
  def d_y(self) -> int:
    return self.output_dim or self.d_model

  @property
  def gate_heads(self) -> int:
    """The heads of O, which the gate multiplies: h_v (h for GBMA, h/2
    for differential attention)."""
    if self.variant == "differential":
      return self.h // 2
    return self.h if self.variant == "general_bilinear" else self.h_v

  @property
  def gate_width(self) -> int:
    """The gates per head: O's width element-wise (d_v; d_M for GBMA, 2
    d_v for differential attention), 1 head-wise, 0 without a gate."""
    if not self.use_gate:
      return 0
    if self.headwise_gate:
      return 1
    return 2 * self.d_v if self.variant == "differential" else self.d_v

  @property
  def compose_hidden(self) -> int:
    """DCMHA's C, its default 2 R h resolved."""
    return self.dynamic_hidden_dim or 2 * self.dynamic_rank * self.h

  @property
  def mixes_logits(self) -> bool:
    """Whether L[n, m, h] = einsum(J[n, m, h_k], P_l[h_k, h]) is computed."""
    return self.variant == "talking_heads" and self.project_logits

  @property
  def mixes_weights(self) -> bool:
    """Whether U[n, m, h_v] = einsum(W[n, m, h], P_w[h, h_v]) is computed."""
    return self.variant == "talking_heads" and self.project_weights


# Sizes that may be None, meaning "use the default" (key_dim is checked per
# variant below).
_OPTIONAL = frozenset(("key_dim", "value_dim", "num_key_heads",
                       "num_value_heads", "output_dim",
                       "num_key_value_heads", "dynamic_hidden_dim"))


def _validate(shape: AttentionShape) -> None:
  """Raises ValueError naming the offending values and what was expected."""
  validation.one_of("variant", shape.variant, COUNTED_LAYERS)
  sizes = ["num_heads", "key_dim", "value_dim", "num_key_heads",
           "num_value_heads", "num_head_groups", "d_model", "output_dim",
           "query_length", "memory_length", "num_key_value_heads",
           "dynamic_rank", "dynamic_hidden_dim"]
  for name in sizes:
    validation.positive_int(name, getattr(shape, name),
                            optional=name in _OPTIONAL)
  attention_spec.checked_gate("AttentionShape", shape.use_gate,
                              shape.headwise_gate)
  if shape.num_key_value_heads is not None:
    if shape.variant == "general_bilinear":
      raise ValueError("general_bilinear has no P_k or P_v to share, got "
                       f"num_key_value_heads={shape.num_key_value_heads}")
    attention_spec.checked_key_value_heads(
        "AttentionShape", shape.num_key_value_heads, shape.h_k, shape.h_v)
  if shape.variant == "general_bilinear":
    _validate_general_bilinear(shape)
  elif shape.key_dim is None:
    raise ValueError(f"{shape.variant} needs key_dim (d_k), got None")
  elif shape.variant == "differential":
    attention_spec.checked_differential_heads(
        "AttentionShape", shape.num_heads, shape.key_dim, shape.value_dim,
        shape.num_key_value_heads)
  if shape.variant != "dcmha":
    for name, default in (("dynamic_rank", 2), ("dynamic_hidden_dim", None),
                          ("static_mix", False)):
      if getattr(shape, name) != default:
        raise ValueError(f"{name} applies only to dcmha, got variant="
                         f"{shape.variant!r} with {name}="
                         f"{getattr(shape, name)!r}")
  if shape.variant != "talking_heads":
    if shape.h_k != shape.h or shape.h_v != shape.h:
      raise ValueError(f"{shape.variant} has one heads dimension, so it needs "
                       f"h_k == h == h_v, got num_key_heads={shape.h_k}, "
                       f"num_heads={shape.h}, num_value_heads={shape.h_v}")
    # These options mean something only to TalkingHeadsAttention.
    for name, default in (("project_logits", True), ("project_weights", True),
                          ("dynamic_projections", ()), ("num_head_groups", 1)):
      if getattr(shape, name) != default:
        raise ValueError(f"{name} applies only to talking_heads, got variant="
                         f"{shape.variant!r} with {name}="
                         f"{getattr(shape, name)!r}")
    return
  if not shape.project_logits and shape.h_k != shape.h:
    raise ValueError("project_logits=False drops P_l[h_k, h], so it needs "
                     f"h_k == h, got num_key_heads={shape.h_k}, "
                     f"num_heads={shape.h}")
  if not shape.project_weights and shape.h != shape.h_v:
    raise ValueError("project_weights=False drops P_w[h, h_v], so it needs "
                     f"h == h_v, got num_heads={shape.h}, "
                     f"num_value_heads={shape.h_v}")
  _validate_dynamic(shape)
  groups = shape.num_head_groups
  for name, value in (("h_k", shape.h_k), ("h", shape.h), ("h_v", shape.h_v)):
    if value % groups:
      raise ValueError(f"num_head_groups={groups} must divide h_k, h and "
                       f"h_v, got {name}={value}")


def _validate_general_bilinear(shape: AttentionShape) -> None:
  # GBMA's P[d_X, d_M, h] fixes d_k = d_v = d_M and has one heads dimension;
  # a size given here would be silently ignored, so it is refused.
  for name in ("key_dim", "value_dim", "num_key_heads", "num_value_heads"):
    if getattr(shape, name) is not None:
      raise ValueError(f"general_bilinear takes no {name} (d_k = d_v = "
                       f"d_model), got {name}={getattr(shape, name)!r}")
  if shape.use_bias:
    raise ValueError("general_bilinear has no biases (Section 6), got "
                     "use_bias=True")


def _validate_dynamic(shape: AttentionShape) -> None:
  names = shape.dynamic_projections
  unknown = [name for name in names if name not in DYNAMIC_PROJECTIONS]
  if unknown or len(set(names)) != len(names):
    raise ValueError(f"dynamic_projections must be distinct names from "
                     f"{DYNAMIC_PROJECTIONS}, got {names}")
  # Appendix A adds each dynamic projection to a static one; without P_l or
  # P_w there would be nothing to add it to.
  for name in names:
    if name in LOGITS_DYNAMIC and not shape.project_logits:
      raise ValueError(f"dynamic projection {name!r} is added to P_l, so it "
                       "needs project_logits=True, got False")
    if name in WEIGHTS_DYNAMIC and not shape.project_weights:
      raise ValueError(f"dynamic projection {name!r} is added to P_w, so it "
                       "needs project_weights=True, got False")


def parameters(shape: AttentionShape) -> int:
  """Number of parameters of one attention layer of this shape.

  Multi-head and talking heads: P_q[d_X, d_k, h_k] + P_k[d_M, d_k, h_k]
  + P_v[d_M, d_v, h_v] + P_o[d_Y, d_v, h_v], which is
  d_model * (2*d_k*h_k + 2*d_v*h_v) when d_Y = d_model; with shared key
  and value heads P_k and P_v have h_kv heads in place of h_k and h_v (and
  their biases likewise). Talking heads adds
  P_l[h_k, h] and P_w[h, h_v], and for its dynamic projections
  P_Xl[d_X, h_k, h], P_Ml[d_M, h_k, h], P_Xw[d_X, h, h_v], P_Mw[d_M, h, h_v];
  each of these is divided by G. Biases add 2*h_k*d_k + h_v*d_v + d_Y.

  General bilinear: P[d_X, d_M, h] + Q[d_M, d_Y, h].

  Differential: multi-head attention's count with h heads of d_k (P_o
  [h/2, 2 d_k, d_Y] holds as many weights as [h, d_k, d_Y]), and the four
  lambda vectors, 4 d_k.

  DCMHA: multi-head attention's count, and D_1[d_X, 4, C] + Q_kw[4, C,
  2R, h] + D_d[d_X, 4, h] (1,703,936 at DCFormer-2.8B's d_X = 2560, h =
  32, C = 128, R = 2), and S[2, h, h] with `static_mix`.

  The gate adds P_g[d_X, h_v, d_v] (head-wise P_g[d_X, h_v]; h and d_M for
  general bilinear), and its bias where the projections have biases.
  """
  s, d = shape, shape.d_model
  gate = (d + s.use_bias) * s.gate_heads * s.gate_width
  if s.variant == "general_bilinear":
    return d * d * s.h + d * s.d_y * s.h + gate
  key_heads, value_heads = s.key_projection_heads, s.value_projection_heads
  total = (d * s.d_k * (s.h_k + key_heads) + d * s.d_v * value_heads +
           s.d_y * s.d_v * s.h_v)
  if s.use_bias:
    total += (s.h_k + key_heads) * s.d_k + value_heads * s.d_v + s.d_y
  # P_l is [h_k, h] and each dynamic generator [d_model, h_k, h]; likewise
  # for P_w. Block-diagonal grouping keeps 1/G of every one of them.
  if s.mixes_logits:
    generators = sum(p in LOGITS_DYNAMIC for p in s.dynamic_projections)
    total += (1 + generators * d) * s.h_k * s.h // s.num_head_groups
  if s.mixes_weights:
    generators = sum(p in WEIGHTS_DYNAMIC for p in s.dynamic_projections)
    total += (1 + generators * d) * s.h * s.h_v // s.num_head_groups
  if s.variant == "differential":
    total += 4 * s.d_k
  if s.variant == "dcmha":
    c, rank = s.compose_hidden, s.dynamic_rank
    total += d * 4 * c + 4 * c * 2 * rank * s.h + d * 4 * s.h
    total += s.static_mix * 2 * s.h * s.h
  return total + gate


def multiplies(shape: AttentionShape) -> int:
  """Scalar multiplications of one attention layer of this shape.

  Multi-head and talking heads, one term per einsum of Section 4:
    n*d_X*d_k*h_k + m*d_M*d_k*h_k + m*d_M*d_v*h_v   (Q, K, V)
    + n*m*d_k*h_k + n*m*d_v*h_v                     (J, O)
    + n*d_Y*d_v*h_v                                 (Y)
    + n*m*h_k*h/G + n*m*h*h_v/G                     (P_l, P_w if present)
  For d_X = d_Y this is Section 5's
    (d_k*h_k + d_v*h_v) * (n*d_X + m*d_M + n*m) + n*m*h*(h_k + h_v).
  Shared key and value heads project K and V to h_kv heads: m*d_M*d_k*h_kv
  and m*d_M*d_v*h_kv in place of the K and V terms (the repeats multiply
  nothing).
  Each dynamic projection adds the cost of generating it (Appendix A):
  n*d_X*h_k*h (x2l), m*d_M*h_k*h (m2l), n*d_X*h*h_v (x2w), m*d_M*h*h_v (m2w),
  each divided by G. Applying it adds no multiplies when it is summed with
  the static projection first (additions only); Tables 8 and 9 count it so.
  (Appendix A's pseudocode comments give n*m*h_k per mixing einsum, a slip
  for n*m*h_k*h.)

  General bilinear: see `_general_bilinear_multiplies`.

  Differential: multi-head attention's count with h heads of d_k (O is
  n*m*(h/2)*(2 d_k), the same), and n*m*h/2 for lambda times the second
  maps and 3*n*h*d_k for the heads' RMSNorm (square, normalize, scale by
  1 - lambda_init).

  DCMHA: multi-head attention's count, and its dynamic weights and
  composes as thattn computes them without a cache: for each of the n
  queries and m keys, its side's two slots, 2*d_X*C (hidden) + 2*C*2R*h
  (factors) + 2*d_X*h (gates) + 2*2*R*h (w_1's RMSNorm: square,
  normalize); for each of the two stages, n*m*(4*R*h + 2*h) (each side's
  two low-rank einsums and its gate), and n*m*h*h more with `static_mix`.
  A decoding step's compose reads each key's [h, h] matrix instead:
  n*m*h*h for the keys' side of each stage.

  The gate adds n*d_X*h_v*d_v to make it (n*d_X*h_v head-wise) and
  n*h_v*d_v to apply it, O times G (h and d_M for general bilinear).
  """
  s, d = shape, shape.d_model
  n, m = s.query_length, s.memory_length
  gate = (n * d * s.gate_heads * s.gate_width +
          s.use_gate * n * s.gate_heads * s.d_v)
  if s.variant == "general_bilinear":
    return _general_bilinear_multiplies(n, m, d, s.d_y, s.h) + gate
  total = ((n * d + n * m) * s.d_k * s.h_k + m * d * s.d_k *
           s.key_projection_heads
           + (n * m + n * s.d_y) * s.d_v * s.h_v + m * d * s.d_v *
           s.value_projection_heads)
  generate = {"x2l": n * d, "m2l": m * d, "x2w": n * d, "m2w": m * d}
  if s.mixes_logits:
    rows = n * m + sum(generate[p] for p in s.dynamic_projections
                       if p in LOGITS_DYNAMIC)
    total += rows * s.h_k * s.h // s.num_head_groups
  if s.mixes_weights:
    rows = n * m + sum(generate[p] for p in s.dynamic_projections
                       if p in WEIGHTS_DYNAMIC)
    total += rows * s.h * s.h_v // s.num_head_groups
  if s.variant == "differential":
    total += n * m * s.h // 2 + 3 * n * s.h * s.d_k
  if s.variant == "dcmha":
    c, rank, h = s.compose_hidden, s.dynamic_rank, s.h
    per_position = 2 * d * c + 2 * c * 2 * rank * h + 2 * d * h + 4 * rank * h
    total += (n + m) * per_position
    total += 2 * n * m * (4 * rank * h + 2 * h + s.static_mix * h * h)
  return total + gate


def _general_bilinear_multiplies(n, m, d_m, d_y, h) -> int:
  """Section 6's GBMA, each three-way einsum done as two, the cheaper way.

  With d_X = d_M:
    L[n, m, h] = einsum(X[n, d_X], M[m, d_M], P[d_X, d_M, h]):
      X.P first: n*d_X*d_M*h + n*m*d_M*h, or M.P first: m*d_M*d_X*h + n*m*d_X*h
    Y[n, d_Y] = einsum(W[n, m, h], M[m, d_M], Q[d_M, d_Y, h]):
      M.Q first: m*d_M*d_Y*h + n*m*d_Y*h, or W.M first: n*m*d_M*h + n*d_M*d_Y*h

  Departs from the paper: for Table 1's row (h=12, d=768, n=m=512) this gives
  12079595520 = 1.208e10, where the paper prints 7.650e9. The printed figure
  is this count with the factor h dropped from the two n*m terms,
    h*n*d_X*d_M + h*m*d_M*d_Y + n*m*(d_M + d_Y) = 7650410496 = 7.650e9,
  which no evaluation order reaches: L alone has n*m*h entries, each a dot
  product over d_M. We keep the honest count; nothing requires matching it.
  """
  logits = h * min(n * d_m * d_m + n * m * d_m, m * d_m * d_m + n * m * d_m)
  output = h * min(m * d_m * d_y + n * m * d_y, n * m * d_m + n * d_m * d_y)
  return logits + output


def variant_shape(variant, *, num_heads, d_model=768, **fields):
  """The `AttentionShape` of the registered variant `variant` (a name of
  `thattn.core.variants`) with h heads: the layer and options its record
  is counted as, then `fields`. key_dim defaults to d_model / h, as in the
  models, for a variant whose heads have a size."""
  record = variants.get(variant)
  if record.counted_as is None:
    raise ValueError(f"Attention variant {variant!r} has no parameter and "
                     "multiply counts (its registry record has no "
                     "counted_as).")
  if not record.reads_memory_width and fields.get("key_dim") is None:
    fields["key_dim"] = d_model // num_heads
  return AttentionShape(**{**record.counted_as, **fields},
                        num_heads=num_heads, d_model=d_model)


def format_count(value: int) -> str:
  """Four significant digits as the paper prints them: 1610612736 -> 1.611e9."""
  mantissa, exponent = f"{value:.3e}".split("e")
  return f"{mantissa}e{int(exponent)}"


def describe(shape: AttentionShape) -> str:
  """A short variant label, e.g. "talking_heads (logits only, x2l)" or
  "multi_head (gate)"."""
  notes = []
  if shape.variant == "talking_heads":
    if not (shape.project_logits and shape.project_weights):
      notes.append("logits only" if shape.project_logits else
                   "weights only" if shape.project_weights else
                   "no projections")
    notes += shape.dynamic_projections
    if shape.num_head_groups != 1:
      notes.append(f"G={shape.num_head_groups}")
  if shape.num_key_value_heads is not None:
    notes.append(f"h_kv={shape.num_key_value_heads}")
  if shape.variant == "dcmha":
    notes.append(f"R={shape.dynamic_rank}, C={shape.compose_hidden}")
    if shape.static_mix:
      notes.append("static mix")
  if shape.use_gate:
    notes.append("head-wise gate" if shape.headwise_gate else "gate")
  return f"{shape.variant} ({', '.join(notes)})" if notes else shape.variant


def markdown_table(*, shapes) -> str:
  """Table 1's columns for each shape, as a markdown table.

  The multiplies header names the first shape's lengths n and m; give shapes
  that share them.
  """
  lines = ["| variant | h_k | h | h_v | d_k | d_v | parameters per att. layer "
           f"| multiplies per att. layer (n={shapes[0].query_length}, "
           f"m={shapes[0].memory_length}) |",
           "|---|---|---|---|---|---|---|---|"]
  for s in shapes:
    lines.append(f"| {describe(s)} | {s.h_k} | {s.h} | {s.h_v} | {s.d_k} "
                 f"| {s.d_v} | {parameters(s)} "
                 f"| {format_count(multiplies(s))} |")
  return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class PaperRow:
  """One row of the paper's tables: the shape and the numbers as printed."""
  table: int
  label: str  # the row's name in the paper
  shape: AttentionShape
  parameters: int
  multiplies: float  # printed to 4 significant digits, e.g. 1.611e9


def _row(table, label, variant, h_k, h, h_v, d_k, d_v, params, mults, **kw):
  # None stands for a blank cell: multi-head rows print only h, and Table 3's
  # one-sided rows leave out the heads dimension they do not project.
  if variant == "general_bilinear":
    shape = AttentionShape(variant, num_heads=h)  # d_k = d_v = d_model
  else:
    shape = AttentionShape(variant, num_heads=h, key_dim=d_k, value_dim=d_v,
                           num_key_heads=h_k, num_value_heads=h_v, **kw)
  return PaperRow(table, label, shape, params, mults)


_MH, _TH, _GB = "multi_head", "talking_heads", "general_bilinear"
_ALL_DYNAMIC = {"dynamic_projections": DYNAMIC_PROJECTIONS}

# Shazeer et al., "Talking-Heads Attention" (arXiv:2003.02436), T5 with
# d_model = 768 and n = m = 512: the columns h_k, h, h_v, d_k, d_v,
# "parameters per att. layer" and "multiplies per att. layer (n=m=512)" of
# Tables 1, 2, 3, 8 and 9. Rows printing "various" (Tables 4, 10) are left out.
PAPER_ROWS = (
    _row(1, "multi-head", _MH, None, 6, None, 128, 128, 2359296, 1.611e9),
    _row(1, "multi-head", _MH, None, 12, None, 64, 64, 2359296, 1.611e9),
    _row(1, "multi-head", _MH, None, 24, None, 32, 32, 2359296, 1.611e9),
    _row(1, "multi-head", _MH, None, 48, None, 16, 16, 2359296, 1.611e9),
    _row(1, "talking-heads", _TH, 6, 6, 6, 128, 128, 2359368, 1.629e9),
    _row(1, "talking-heads", _TH, 12, 12, 12, 64, 64, 2359584, 1.686e9),
    _row(1, "talking-heads", _TH, 24, 24, 24, 32, 32, 2360448, 1.913e9),
    _row(1, "talking-heads", _TH, 48, 48, 48, 16, 16, 2363904, 2.819e9),
    _row(1, "multi-head", _MH, None, 24, None, 64, 64, 4718592, 3.221e9),
    _row(1, "general bilinear", _GB, None, 12, None, 768, 768, 14155776,
         7.650e9),
    _row(1, "[Raffel et al., 2019]", _MH, None, 12, None, 64, 64, 2359296,
         1.611e9),
    _row(2, "talking-heads", _TH, 6, 6, 6, 128, 128, 2359368, 1.629e9),
    _row(2, "talking-heads", _TH, 6, 24, 6, 128, 128, 2359584, 1.686e9),
    _row(2, "talking-heads", _TH, 24, 6, 24, 32, 32, 2359584, 1.686e9),
    _row(2, "talking-heads", _TH, 6, 24, 24, 128, 32, 2360016, 1.799e9),
    _row(2, "talking-heads", _TH, 24, 24, 6, 32, 128, 2360016, 1.799e9),
    _row(2, "talking-heads", _TH, 24, 24, 24, 32, 32, 2360448, 1.913e9),
    _row(3, "multi-head", _MH, None, 24, None, 32, 32, 2359296, 1.611e9),
    _row(3, "project logits", _TH, 24, 24, None, 32, 32, 2359872, 1.762e9,
         project_weights=False),
    _row(3, "project weights", _TH, None, 24, 24, 32, 32, 2359872, 1.762e9,
         project_logits=False),
    _row(3, "talking-heads", _TH, 24, 24, 24, 32, 32, 2360448, 1.913e9),
    _row(8, "multi-head", _MH, None, 12, None, 64, 64, 2359296, 1.611e9),
    _row(8, "talking-heads", _TH, 12, 12, 12, 64, 64, 2359584, 1.686e9),
    _row(8, "dyn. proj.", _TH, 12, 12, 12, 64, 64, 2801952, 1.913e9,
         **_ALL_DYNAMIC),
    _row(8, "multi-head", _MH, None, 24, None, 32, 32, 2359296, 1.611e9),
    _row(8, "talking-heads", _TH, 24, 24, 24, 32, 32, 2360448, 1.913e9),
    _row(8, "dynamic proj.", _TH, 24, 24, 24, 32, 32, 4129920, 2.819e9,
         **_ALL_DYNAMIC),
    _row(9, "talking-heads", _TH, 12, 12, 12, 64, 64, 2359584, 1.686e9),
    _row(9, "dyn. proj. P_Xl", _TH, 12, 12, 12, 64, 64, 2470176, 1.743e9,
         dynamic_projections=("x2l",)),
    _row(9, "dyn. proj. P_Xw", _TH, 12, 12, 12, 64, 64, 2470176, 1.743e9,
         dynamic_projections=("x2w",)),
    _row(9, "dyn. proj. P_Ml", _TH, 12, 12, 12, 64, 64, 2470176, 1.743e9,
         dynamic_projections=("m2l",)),
    _row(9, "dyn. proj. P_Mw", _TH, 12, 12, 12, 64, 64, 2470176, 1.743e9,
         dynamic_projections=("m2w",)),
    _row(9, "dyn. proj.", _TH, 12, 12, 12, 64, 64, 2801952, 1.913e9,
         **_ALL_DYNAMIC),
)


def paper_shapes() -> Tuple[AttentionShape, ...]:
  """The distinct configurations of `PAPER_ROWS`, in the order first seen."""
  return tuple(dict.fromkeys(row.shape for row in PAPER_ROWS))
