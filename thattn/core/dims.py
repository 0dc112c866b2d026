"""The einsum letter legend and the logical axis names used across thattn.

Every einsum equation in thattn is a fixed string constant built from these
letters, so a reader can translate any line back to the paper's notation:

| letter | paper      | meaning                                             |
|--------|------------|-----------------------------------------------------|
| b      | (batch)    | examples in the batch                               |
| n      | n          | query positions                                     |
| m      | m          | memory positions                                    |
| d      | d_X        | query width (d_model for self-attention)            |
| e      | d_M        | memory width                                        |
| o      | d_Y        | output width                                        |
| i      | h_k        | key heads: heads of the queries, keys and logits J  |
| h      | h          | softmax heads: heads of the logits L and weights W  |
| j      | h_v        | value heads: heads of U, the values and the output  |
| k      | d_k        | query/key size per head                             |
| v      | d_v        | value size per head                                 |
| g      | G          | head groups of grouped talking heads                |
| t      | (vocab)    | vocabulary entries (token ids)                      |
| f      | d_ff       | hidden units of the feed-forward layer              |
| c      | (chunk)    | the query rows of one chunk (`layers/chunked.py`)   |
| p      | (masked)   | masked positions gathered for a prediction head     |
| s      | (steps)    | decoding steps written into a cache in one call     |
| x      | (features) | a tensor's trailing dimensions, flattened into one  |
| r      | (rotary)   | rotary frequencies: half the rotated size per head  |
| u      | (stages)   | DCMHA's compose stages: pre- and post-softmax       |
| z      | (C)        | DCMHA's dynamic-weight hidden units                 |
| y      | (R)        | DCMHA's rank of the dynamic head mixes              |
| a      | (position) | positions of either side, n or m (DCMHA)            |

Grouped talking heads (`TalkingHeadsAttention(num_head_groups=G)`) splits
each heads dimension into [G, heads / G], group-major: group g holds key
heads [g*h_k/G, (g+1)*h_k/G), softmax heads [g*h/G, (g+1)*h/G) and value
heads [g*h_v/G, (g+1)*h_v/G). In its einsums, next to `g`, the letters i, h
and j count the heads within one group.

Logical axes name each weight dimension once. `thattn.sharding` maps them to
mesh axes, so a layer never mentions a device.
"""

# Logical axis names (t5x-style). A weight's `logical_axes` entry is a tuple of
# these, one per dimension.
D_MODEL = "d_model"
KEY_HEADS = "key_heads"
HEADS = "heads"
VALUE_HEADS = "value_heads"
D_K = "d_k"
D_V = "d_v"
D_FF = "d_ff"
VOCAB = "vocab"
RELATIVE_BUCKETS = "relative_buckets"
# Grouped talking heads: the block-diagonal P_l is stored as its blocks
# [G, h_k/G, h/G] with axes (HEAD_GROUPS, KEY_HEADS_PER_GROUP,
# HEADS_PER_GROUP), and P_w as [G, h/G, h_v/G]. Sharding HEAD_GROUPS on the
# same mesh axis as KEY_HEADS and VALUE_HEADS keeps each group's heads, and
# its blocks, on one device (the group-major order above matches DTensor's
# contiguous sharding whenever the mesh axis size divides G).
HEAD_GROUPS = "head_groups"
KEY_HEADS_PER_GROUP = "key_heads_per_group"
HEADS_PER_GROUP = "heads_per_group"
VALUE_HEADS_PER_GROUP = "value_heads_per_group"

# DCMHA (thattn.ops.dcmha): the dynamic weights' slot axis (pre/query,
# pre/key, post/query, post/key), hidden units C and rank rows (2R: w_1's
# then w_2's), and the two stages of the optional static mix S.
COMPOSE_SLOTS = "compose_slots"
DYNAMIC_HIDDEN = "dynamic_hidden"
DYNAMIC_RANK = "dynamic_rank"
COMPOSE_STAGES = "compose_stages"

LOGICAL_AXES = (D_MODEL, KEY_HEADS, HEADS, VALUE_HEADS, D_K, D_V, D_FF, VOCAB,
                RELATIVE_BUCKETS, HEAD_GROUPS, KEY_HEADS_PER_GROUP,
                HEADS_PER_GROUP, VALUE_HEADS_PER_GROUP, COMPOSE_SLOTS,
                DYNAMIC_HIDDEN, DYNAMIC_RANK, COMPOSE_STAGES)
