"""The mechanism every checkpoint source shares: a name-and-shape map.

A format (`thattn.converters`' modules, `thattn.models.
hugging_face_decoders`) reads its checkpoint into `{source name: array}`
and says, with `Rule`s, which source array fills each thattn weight and
how (a transpose, a reshape into heads, the folded 1/sqrt(d_k)). `plan`
(a tf_keras model) and `plan_shapes` (any model's weights by name and
shape: Keras 3's) check the whole map before a single weight is written:

- every weight of the thattn model is filled exactly once, by a rule or by
  the identity start of a projected variant (`identity_start`);
- every source array is used by a rule, or dropped by a name the format
  lists (a task head, an optimizer slot, a buffer), so nothing is lost
  silently;
- each transformed array has its weight's shape;

and raises one ValueError naming every mismatch (the weights, the source
names, the shapes). Weights are named as in the tf_keras model without
the ":0" (`block_0/attention/attention/query/kernel`). NumPy only: Keras
3's loading of Hugging Face folders runs it without TensorFlow.
"""

import dataclasses
import re
from typing import Callable

import numpy as np

from thattn.core import attention_spec
from thattn.core import initial_weights

# The tokens of a projected variant's weights that the source, a multi-head
# model, has no value for: P_l and P_w start at the identity and the dynamic
# projections at zero, so the converted model computes multi-head attention
# exactly (the paper's Section 4: P_l = P_w = I is multi-head attention).
IDENTITY_TOKENS = ("pre_softmax_projection", "post_softmax_projection")
ZERO_TOKENS = ("x2l", "m2l", "x2w", "m2w")
# DCMHA's weights (`attention_spec.COMPOSE_KERNELS`, the static mix): its
# compose is the identity with Q_kw's w_2 rows, D_d and S at zero. D_1
# and w_1's rows are drawn as the layer draws them (seeded by the weight's
# name, `_DCMHA_START_SEED`), not zeroed: at zero the gradient would never
# reach w_2 (each factor's gradient is the other's).
_DCMHA_START_SEED = 0


def _keep(array):
  return array


@dataclasses.dataclass(frozen=True)
class Rule:
  """thattn weight `target` <- `transform(arrays[source])`."""
  target: str
  source: str
  transform: Callable[[np.ndarray], np.ndarray] = _keep


@dataclasses.dataclass(frozen=True)
class Source:
  """What a format module reads from a checkpoint folder: the thattn
  config, the arrays by source name, the rules, the source names it drops
  on purpose (regular expressions), the tokenizer (or None) and the model
  family ("bert", "albert")."""
  config: object
  arrays: dict
  rules: list
  dropped: tuple
  tokenizer: object
  family: str


def albert_embedding_size(embedding_size, width, where):
  """ALBERT's E, refused where it equals the hidden width: thattn builds
  ALBERT's E -> d_model projection only when E < d_model, and ALBERT
  always has one (a learned matrix, not the identity)."""
  if embedding_size >= width:
    raise ValueError(f"{where}: embedding size {embedding_size} is not "
                     f"below the hidden size {width}; thattn's ALBERT "
                     "projects E -> d_model only when E < d_model "
                     "(nothing was written).")
  return embedding_size


# A BERT layer's parts, by the name a format's `parts` dict gives each:
# attention's query, key and value (their kernels split into heads), its
# output (its kernel's input merged from heads), the two LayerNorms and
# the feed-forward network's two dense layers.
BLOCK_PARTS = ("query", "key", "value", "attention_output", "attention_norm",
               "ff_input", "ff_output", "ff_norm")
# google-research/bert's names of an encoder layer's parts, which
# transformers kept with '.' for '/': Google's and Hugging Face's BERT.
_BERT_LAYER_NAMES = {
    "query": "attention/self/query", "key": "attention/self/key",
    "value": "attention/self/value",
    "attention_output": "attention/output/dense",
    "attention_norm": "attention/output/LayerNorm",
    "ff_input": "intermediate/dense", "ff_output": "output/dense",
    "ff_norm": "output/LayerNorm"}


def bert_layer_parts(layer, separator="/"):
  """The `Naming.block` parts of BERT's encoder layer `layer` (its name
  prefix), in google-research/bert's names joined by `separator`."""
  return {part: separator.join([layer, *name.split("/")])
          for part, name in _BERT_LAYER_NAMES.items()}


@dataclasses.dataclass(frozen=True)
class Naming:
  """How a format names a layer's variables: `variable(layer, which)` for
  which in kernel, bias, gamma, beta; `transposed`: kernels stored
  [out, in], as PyTorch's Linear does (TensorFlow and Keras store
  [in, out]). Attention kernels may be plain dense ones, [d, h*d_k]
  (Hugging Face, Google's original checkpoints), or already per head,
  [d, h, d_k] and [h, d_v, d] (KerasHub, Model Garden): `block` reshapes
  either to thattn's."""
  variable: Callable[[str, str], str]
  transposed: bool = False

  def kernel(self, array):
    """A dense kernel as Keras's [in, out]."""
    return np.asarray(array).T if self.transposed else np.asarray(array)

  def dense(self, target, source, kernel=None):
    return [Rule(f"{target}/kernel", self.variable(source, "kernel"),
                 kernel or self.kernel),
            Rule(f"{target}/bias", self.variable(source, "bias"))]

  def norm(self, target, source):
    return [Rule(f"{target}/{which}", self.variable(source, which))
            for which in ("gamma", "beta")]

  def block(self, block, parts, heads, key_dim):
    """The rules of one post-norm encoder layer: thattn's `block` prefix
    (block_<i> or shared_block) from the source layers `parts` names (a
    dict over BLOCK_PARTS). The query, key and value kernels split their
    output into [h, d_k] head-major, as BERT's attention does, and the
    query's kernel and bias take 1/sqrt(d_k), which BERT applies to the
    logits at run time and thattn never does."""
    if set(parts) != set(BLOCK_PARTS):
      raise ValueError(f"parts names {sorted(parts)}; expected "
                       f"{sorted(BLOCK_PARTS)}.")
    attention = f"{block}/attention/attention"
    rules = []
    for part in ("query", "key", "value"):
      scale = key_dim ** -0.5 if part == "query" else 1.0
      rules += [
          Rule(f"{attention}/{part}/kernel",
               self.variable(parts[part], "kernel"),
               lambda array, scale=scale: (self.kernel(array) * scale
                                           ).reshape(-1, heads, key_dim)),
          Rule(f"{attention}/{part}/bias", self.variable(parts[part], "bias"),
               lambda array, scale=scale: (np.asarray(array) * scale
                                           ).reshape(heads, key_dim))]
    rules += self.dense(
        f"{attention}/output", parts["attention_output"],
        lambda array: self.kernel(array).reshape(heads, key_dim, -1))
    rules += self.norm(f"{block}/attention_norm", parts["attention_norm"])
    rules += self.dense(f"{block}/feed_forward/input", parts["ff_input"])
    rules += self.dense(f"{block}/feed_forward/output", parts["ff_output"])
    rules += self.norm(f"{block}/feed_forward_norm", parts["ff_norm"])
    return rules


def weight_names(model):
  """{name without ':0': variable} of a tf_keras model, in order."""
  return {re.sub(r":\d+$", "", weight.name): weight
          for weight in model.weights}


def identity_start(names):
  """{name: array} for the weights of `names` (name -> shape) that a
  multi-head source has no value for: identity P_l and P_w, zero dynamic
  projections, DCMHA's kernels at its identity. Raises ValueError for a
  P_l or P_w that is not square (h_k, h and h_v must be equal to start
  from multi-head attention)."""
  start = {}
  for name, shape in names.items():
    parts = name.split("/")  # `.../pre_softmax_projection`, `.../x2l/kernel`
    if parts[-1] in IDENTITY_TOKENS:
      if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(
            f"{name} has shape {list(shape)}; an identity start needs h_k = "
            "h = h_v (a square projection) to equal the multi-head source.")
      start[name] = np.eye(shape[0], dtype=np.float32)
    elif set(parts[-2:]) & set(ZERO_TOKENS):
      start[name] = np.zeros(shape, np.float32)
    elif parts[-1] in attention_spec.COMPOSE_KERNELS + (
        attention_spec.STATIC_MIX,):
      start[name] = _dcmha_start(name, parts[-1], shape)
  return start


def _dcmha_start(name, kind, shape):
  """A DCMHA weight at its identity start (see `_DCMHA_START_SEED`)."""
  if kind in (attention_spec.COMPOSE_KERNELS[2], attention_spec.STATIC_MIX):
    return np.zeros(shape, np.float32)
  drawn = initial_weights.sample(
      {"class_name": "RandomNormal",
       "config": {"stddev": attention_spec.compose_stddev(kind, shape)}},
      shape, _DCMHA_START_SEED, name)
  if kind == attention_spec.COMPOSE_KERNELS[1]:  # w_2: Q_kw[..., R:, :]
    drawn[:, :, shape[2] // 2:] = 0.0
  return drawn


def plan(model, arrays, rules, *, dropped=(), source="the source"):
  """{weight name: array} for every weight of the tf_keras `model`, checked
  as the module says; `dropped` are regular expressions of source names
  that are meant to be left out. Raises ValueError naming every mismatch."""
  return plan_shapes(
      {name: tuple(weight.shape) for name, weight in
       weight_names(model).items()}, arrays, rules, dropped=dropped,
      source=source)


def plan_shapes(shapes, arrays, rules, *, dropped=(), source="the source",
                target_name=lambda name: name):
  """`plan` for a model given as {weight name: shape} (a Keras 3 model's
  weights, named as `target_name` names the rules' tf_keras targets:
  `thattn.core.weight_names.shared_name`, both fronts' common names)."""
  values, problems = {}, []
  for rule in rules:
    rule = dataclasses.replace(rule, target=target_name(rule.target))
    if rule.target not in shapes:
      problems.append(f"{rule.target} (from {rule.source}) is not a weight "
                      "of the thattn model")
    elif rule.target in values:
      problems.append(f"{rule.target} is filled twice")
    elif rule.source not in arrays:
      problems.append(f"{source} has no {rule.source} (for {rule.target})")
    else:
      shape = list(np.shape(arrays[rule.source]))
      try:
        value = np.asarray(rule.transform(arrays[rule.source]), np.float32)
      except ValueError as error:  # a reshape into heads that cannot be
        problems.append(f"{rule.source} {shape} cannot become "
                        f"{rule.target} ({error})")
        continue
      if value.shape != shapes[rule.target]:
        problems.append(f"{rule.source} {shape} gives {list(value.shape)} "
                        f"for {rule.target}, which is "
                        f"{list(shapes[rule.target])}")
      values[rule.target] = value
  values.update({name: value for name, value in identity_start(
      {name: shape for name, shape in shapes.items()
       if name not in values}).items()})
  problems += [f"{name} {list(shapes[name])} has no value in {source}"
               for name in shapes if name not in values]
  used = {rule.source for rule in rules}
  problems += [f"{source}'s {name} is used by no weight" for name in arrays
               if name not in used and
               not any(re.fullmatch(pattern, name) for pattern in dropped)]
  if problems:
    raise ValueError(f"Cannot convert {source}: " + "; ".join(problems) +
                     " (nothing was written).")
  return values


def assign(model, values):
  """Writes `plan`'s values into the model's weights."""
  for name, weight in weight_names(model).items():
    weight.assign(values[name])
