"""A cache entry's digest: {file name: SHA-256}, written last into its folder.

A cached folder (thattn's learned default tokenizer) is trusted only when
its files are exactly those its digest lists, with those hashes: what a
killed write or a damaged disk left is found and learned again.
"""

import hashlib
import json
import os

import tensorflow as tf

FILE = "cache_digest.json"


def write(directory):
  """Writes the digest of every file in `directory`."""
  digests = {name: _sha256(os.path.join(directory, name))
             for name in sorted(tf.io.gfile.listdir(directory))}
  with tf.io.gfile.GFile(os.path.join(directory, FILE), "w") as f:
    f.write(json.dumps(digests, indent=1, sort_keys=True) + "\n")


def damage(directory):
  """What does not match a cached folder's digest, or None."""
  digest_path = os.path.join(directory, FILE)
  if not tf.io.gfile.exists(digest_path):
    return (f"it has no {FILE} (written by an older thattn, or cut "
            "short)")
  try:
    with tf.io.gfile.GFile(digest_path, "rb") as f:
      digests = json.loads(f.read().decode("utf-8"))
    names = set(tf.io.gfile.listdir(directory)) - {FILE}
    if not isinstance(digests, dict) or set(digests) != names:
      return f"its files are not those {FILE} lists"
    for name, digest in digests.items():
      if _sha256(os.path.join(directory, name)) != digest:
        return f"{name} does not match {FILE}"
  except (tf.errors.OpError, OSError, ValueError) as error:
    return f"{type(error).__name__}: {error}"
  return None


def _sha256(path):
  with tf.io.gfile.GFile(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()
