"""An attention variant defined outside thattn: residual talking heads.

Talking heads (Shazeer et al., 2020, Section 4) replaces the logits and the
weights by their head mixes, L = J P_l and U = W P_w. This variant keeps
each head's own scores and adds the mix on top, as DCFormer's composition
does (A' = A + ...):

    L[b, h, n, m] = J[b, h, n, m] + einsum(J[b, h, n, m], D_l[h, g])
    U[b, h, n, m] = W[b, h, n, m] + einsum(W[b, h, n, m], D_w[h, g])

With D_l and D_w starting at zero it starts as multi-head attention, and
its weights are talking heads' (P_l = I + D_l, P_w = I + D_w): the same
parameters and multiplies, hence `counted_as`.

This one file is all a user writes: the math as functions of an ops
namespace (`keras.ops` on Keras 3, TensorFlow under the same names on
tf_keras), its weights, and the record. Then, with this module importable
(on PYTHONPATH):

    thattn-train --attention_module=custom_variant \\
        --attention=residual_talking_heads

and, in Python, after `import custom_variant`:

    thattn.models.create_model("bert_tiny", attention="residual_talking_heads")
    thattn.keras3.models.create_model("bert_tiny",
                                      attention="residual_talking_heads")
    thattn.keras3.make_attention("residual_talking_heads", 4, 16)
"""

from thattn.core import variants

# The head mix, in the letters of thattn.core.dims: f the heads mixed, g
# the heads they become.
_MIX = "bfnm,fg->bgnm"


def residual_logits(ops, weights, dot_products):
  """L = J + J D_l, from J[b, h, n, m]."""
  return dot_products + ops.einsum(_MIX, dot_products,
                                   weights["logits_residual"])


def residual_weights(ops, weights, softmax_weights):
  """U = W + W D_w, from W[b, h, n, m]."""
  return softmax_weights + ops.einsum(_MIX, softmax_weights,
                                      weights["weights_residual"])


RESIDUAL_TALKING_HEADS = variants.register(variants.Variant(
    name="residual_talking_heads",
    source="docs/examples/custom_variant.py (talking heads, Shazeer et al. "
           "2020, Section 4, in residual form)",
    summary="talking heads as a residual on each head: L = J + J D_l, "
            "U = W + W D_w",
    mix_logits=residual_logits,
    mix_weights=residual_weights,
    weights=(variants.Weight("logits_residual", ("heads", "heads")),
             variants.Weight("weights_residual", ("heads", "heads"))),
    identity_start=False,
    counted_as={"variant": "talking_heads"}))
