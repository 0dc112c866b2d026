"""An attention variant registered from outside thattn, as a user's module
registers one (docs/architecture.md, "Adding a variant"): talking heads
whose P_l and P_w mix heads only within two groups, an existing layer's
option (`num_head_groups`)."""

from thattn.core import variants

variants.register(variants.Variant(
    name="grouped_talking_heads",
    source="thattn: TalkingHeadsAttention(num_head_groups=2)",
    summary="talking heads mixing heads within two groups",
    layer="TalkingHeadsAttention", options={"num_head_groups": 2},
    pre_softmax=True, post_softmax=True,
    counted_as={"variant": "talking_heads", "num_head_groups": 2}))
