"""The API reference (docs/api) builds from the docstrings, warnings as errors.

Sphinx, from the `docs` extra, builds docs/api as a reader would (the
command is in docs/api/conf.py) with `-W --keep-going`, in a process of its
own: a docstring that docutils cannot parse (an unexpected indentation, a
stray `*`, a list without its blank line) fails the build. Then each page
must exist and show its package's public names, and the paper's
"Computation" blocks must stay literal blocks, line for line.

CI installs the extra, so a missing Sphinx fails here rather than skips.
"""

import html
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "api"

# Each page and names it must show: the documented objects' full names.
PAGES = {
    "layers.html": [
        "thattn.layers.MultiHeadAttention",
        "thattn.layers.TalkingHeadsAttention",
        "thattn.layers.GeneralBilinearAttention",
        "thattn.layers.relative_position_bucket",
        "thattn.layers.from_keras",
    ],
    "keras3.html": [
        "thattn.keras3.MultiHeadAttention",
        "thattn.keras3.TalkingHeadsAttention",
        "thattn.keras3.GeneralBilinearAttention",
        "thattn.keras3.layout_map",
        "thattn.keras3.model_layout_map",
    ],
    "keras3_models.html": [
        "thattn.keras3.models.create_model",
        "thattn.keras3.models.build_t5",
        "thattn.keras3.models.PreNormBlock",
    ],
    "models.html": [
        "thattn.models.create_model",
        "thattn.models.load",
        "thattn.models.BertConfig",
        "thattn.models.T5Generator",
    ],
    "training.html": [
        "thattn.launch.train",
        "thattn.training.trainer.train",
        "thattn.training.options.TrainOptions",
    ],
    "sharding.html": [
        "thattn.sharding.LayoutRules",
        "thattn.sharding.MeshSpec",
        "thattn.sharding.build_sharded",
    ],
}

# Lines of the paper's notation that must render as literal blocks (<pre>).
COMPUTATION = {
    "layers.html": [
        "L[h, n, m]     = einsum(J[h_k, n, m], P_l[h_k, h])              # P_l",
        "W[h, n, m]   = softmax(L[h, n, m] + bias, masked, reduced_dim=m)",
    ],
    "keras3.html": [
        "U[h_v, n, m]   = einsum(W, P_w[h, h_v]) + dynamic terms"
        "      (talking)",
    ],
}


def _text(fragment):
  """The text of some HTML, without tags or entities."""
  return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_api_reference_builds_without_warnings(tmp_path):
  assert importlib.util.find_spec("sphinx") is not None, (
      "Sphinx is missing: the API reference needs the docs extra, "
      "pip install -e '.[docs]'")
  out = tmp_path / "html"
  # KERAS_BACKEND pinned: the pages must not depend on the runner's choice.
  result = subprocess.run(
      [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q",
       "-b", "html", "-d", str(tmp_path / "doctrees"), str(SOURCE),
       str(out)],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, KERAS_BACKEND="jax"), check=False)
  # Sphinx's own warnings (not TensorFlow's start-up lines).
  warnings = [line for line in result.stderr.splitlines()
              if ("WARNING" in line or "ERROR" in line) and "absl" not in line]
  status = result.returncode
  assert status == 0, (f"sphinx-build exited {status}:\n" + "\n".join(
      warnings or result.stderr.splitlines()[-30:]))

  for page, names in PAGES.items():
    path = out / page
    assert path.exists(), f"{page} was not built"
    text = _text(path.read_text())
    missing = [name for name in names if name not in text]
    assert not missing, f"{page} does not show {missing}"
  # TalkingHeadsAttention for both front ends, each with its arguments.
  for page in ("layers.html", "keras3.html"):
    text = _text((out / page).read_text())
    assert "TalkingHeadsAttention(num_heads, key_dim" in text, page
    assert "dynamic_projections" in text, page
  assert "DEFAULT_LAYOUT_RULES" in _text((out / "keras3.html").read_text())
  training = _text((out / "training.html").read_text())
  assert "run driver" in training and "export_run" in training

  for page, lines in COMPUTATION.items():
    blocks = [_text(block) for block in re.findall(
        r"<pre>(.*?)</pre>", (out / page).read_text(), flags=re.S)]
    for line in lines:
      assert any(line in block.splitlines() for block in blocks), (
          f"{page}: {line!r} is not a line of a literal block")
