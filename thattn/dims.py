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

LOGICAL_AXES = (D_MODEL, KEY_HEADS, HEADS, VALUE_HEADS, D_K, D_V, D_FF, VOCAB,
                RELATIVE_BUCKETS)
