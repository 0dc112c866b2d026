r"""Prints parameters and multiplies per attention layer as a markdown table.

With no flags, prints Table 1's columns for every configuration of the
paper's Tables 1, 2, 3, 8 and 9, as computed by `thattn.core.complexity`:

  thattn-complexity

With --variant (a registered attention variant), prints the row for one
configuration:

  thattn-complexity --variant=talking_heads --num_heads=24 --key_dim=32 \
      --dynamic_projections=x2l,m2w --length=1024

--d_model, --length and --memory_length also apply to the paper's table.
"""

import dataclasses

from absl import app
from absl import flags

from thattn.core import complexity
from thattn.core import variants
from thattn.bin import cli

_VARIANT = flags.DEFINE_enum(
    "variant", None,
    [v.name for v in variants.all_variants() if v.counted_as is not None],
    "Attention variant (thattn.core.variants). Unset: print the paper's "
    "configurations.")
_NUM_HEADS = flags.DEFINE_integer("num_heads", None, "h, the softmax heads.")
_KEY_DIM = flags.DEFINE_integer("key_dim", None, "d_k.")
_VALUE_DIM = flags.DEFINE_integer("value_dim", None, "d_v; default d_k.")
_NUM_KEY_HEADS = flags.DEFINE_integer("num_key_heads", None, "h_k; default h.")
_NUM_VALUE_HEADS = flags.DEFINE_integer("num_value_heads", None,
                                        "h_v; default h.")
_PROJECT_LOGITS = flags.DEFINE_boolean("project_logits", True,
                                       "talking_heads: use P_l[h_k, h].")
_PROJECT_WEIGHTS = flags.DEFINE_boolean("project_weights", True,
                                        "talking_heads: use P_w[h, h_v].")
_DYNAMIC_PROJECTIONS = flags.DEFINE_list(
    "dynamic_projections", [],
    f"talking_heads: any of {','.join(complexity.DYNAMIC_PROJECTIONS)}.")
_NUM_HEAD_GROUPS = flags.DEFINE_integer(
    "num_head_groups", 1,
    "talking_heads: G diagonal blocks in P_l, P_w and the dynamic "
    "projections (heads mix only within their group).")
_NUM_KEY_VALUE_HEADS = flags.DEFINE_integer(
    "num_key_value_heads", None,
    "h_kv: P_k and P_v project to h_kv heads, shared by the key and value "
    "heads (grouped-query attention); default none shared.")
_USE_BIAS = flags.DEFINE_boolean("use_bias", False,
                                 "Count the biases of P_q, P_k, P_v, P_o.")
_D_MODEL = flags.DEFINE_integer("d_model", 768, "d_X = d_M.")
_OUTPUT_DIM = flags.DEFINE_integer("output_dim", None, "d_Y; default d_model.")
_LENGTH = flags.DEFINE_integer("length", 512, "n, the query positions.")
_MEMORY_LENGTH = flags.DEFINE_integer("memory_length", None,
                                      "m, the memory positions; default n.")

# Flags that describe one configuration, so they need --variant.
_SHAPE_FLAGS = (_NUM_HEADS, _KEY_DIM, _VALUE_DIM, _NUM_KEY_HEADS,
                _NUM_VALUE_HEADS, _PROJECT_LOGITS, _PROJECT_WEIGHTS,
                _DYNAMIC_PROJECTIONS, _NUM_HEAD_GROUPS, _USE_BIAS,
                _OUTPUT_DIM, _NUM_KEY_VALUE_HEADS)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  sizes = dict(d_model=_D_MODEL.value, query_length=_LENGTH.value,
               memory_length=_MEMORY_LENGTH.value or _LENGTH.value)
  try:
    if _VARIANT.value is None:
      given = [f"--{flag.name}" for flag in _SHAPE_FLAGS if flag.present]
      if given:
        raise app.UsageError(f"--variant is needed with {', '.join(given)}")
      shapes = [dataclasses.replace(shape, **sizes)
                for shape in complexity.paper_shapes()]
    else:
      if _NUM_HEADS.value is None:
        raise app.UsageError("--variant needs --num_heads")
      # The variant's own options (project_logits's lack of P_w, dynamic's
      # four projections), then what the flags given set.
      given = {flag.name: flag.value for flag in _SHAPE_FLAGS
               if flag.present and flag is not _NUM_HEADS}
      shapes = [complexity.variant_shape(
          _VARIANT.value, num_heads=_NUM_HEADS.value, **sizes, **given)]
  except ValueError as e:
    # A bad configuration is a usage error: print the message, not a trace.
    raise app.UsageError(str(e)) from e
  print(complexity.markdown_table(shapes=shapes))


def run():
  """Entry point of the `thattn-complexity` console script."""
  cli.run(main, __name__, __doc__)


if __name__ == "__main__":
  run()
