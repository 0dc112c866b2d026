"""Table lookups whose gradients hold no scatter-add where it would be slow.

A gather E[ids]'s gradient is a scatter-add of every looked-up row into E.
jaxlib 0.10.2-0.11 on GPUs compile a float32 scatter-add as a
compare-and-swap loop, which serializes the rows that land on one address
(jax-ml/jax#38806, openxla/xla#46225): a small table looked up many times
per step is the worst case, as BERT's 2 token types (16,384 rows into 2 at
batch 32 x 512) and T5's 32 relative-position buckets (n * m rows into 32
per stack). Selection, sum over t of [ids == t] * E[t], computes the same
rows exactly (one term is nonzero), and its gradient is a reduction over the
rows. Original BERT looks small vocabularies up as one-hot products for the
same reason on TPUs; a product would round E to TF32 on GPUs, selection
does not. The measurements are in benchmarks/RESULTS.md, "Keras 3 models
on a GPU".
"""

from keras import ops

# Vocabularies up to this size are looked up by selection; larger ones by
# a gather (selection costs t times the gathered rows' elements).
SMALL_VOCABULARY = 16


def select_rows(table, ids):
  """E[ids] by selection: table[t, ...] at int ids[...] ->
  [..., *table.shape[1:]], exact, with a reduction as its gradient."""
  table = ops.convert_to_tensor(table)  # a Keras variable's value
  vocab_size = table.shape[0]
  # picked[..., t, 1...] = ids[...] == t, against E[t, ...].
  picked = ops.equal(ops.expand_dims(ids, -1),
                     ops.arange(vocab_size, dtype=ids.dtype))
  for _ in table.shape[1:]:
    picked = ops.expand_dims(picked, -1)
  return ops.sum(ops.where(picked, table, ops.zeros((), table.dtype)),
                 axis=-len(table.shape))


def lookup(table, ids):
  """E[ids]: by selection for at most SMALL_VOCABULARY rows, else a
  gather."""
  if table.shape[0] is None or table.shape[0] > SMALL_VOCABULARY:
    return ops.take(table, ids, axis=0)
  return select_rows(table, ids)
