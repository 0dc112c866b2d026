"""Data: sources, the embedded corpus, readers, tokenizers and input pipelines.

Nothing here knows a model or a task. Readers (`glue`, `squad`) raise
`errors.DataError` naming the file and line of bad data, or drop and count
it; pipelines (`batches`) address every batch by (seed, step), so a resumed
run sees exactly the batches an uninterrupted one would.
"""

from thattn.core import requirements  # pylint: disable=g-bad-import-order

# Before the first TensorFlow import: names the pip extra if it is missing.
requirements.require("thattn.data",
               ("tensorflow", "tensorflow_text", "sentencepiece"))
