"""The attention variants' registry: its records, the docs' table, and
variants registered from outside the package, built and trained.

`tests/core/grouped_variant.py` registers an existing layer with options,
the way a user's module does, and a model built with it has the layer and
options it names. docs/examples/custom_variant.py registers a variant by
its head mixes, and `thattn-train --attention_module=custom_variant`
trains it on both backends, step for step alike, and records the module
in the runs' run_config.json, which `thattn.models.load` imports (its
layers are checked against NumPy in
tests/layers/head_mixing_attention_test.py and, on the three Keras 3
backends, tests/keras3/custom_variant_checks.py).
"""

import json
import os
import pathlib
import re
import sys

import numpy as np
import pytest

from tests import cli
from tests import forkserver
from tests.keras3 import processes
from tests.training import local_cluster
from thattn.core import variants

ROOT = pathlib.Path(__file__).resolve().parents[2]
_ENV = processes.train_environment()
# The repository (for tests.core.grouped_variant) and the example's folder.
_ENV["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), str(ROOT / "docs" / "examples")] +
    [p for p in [os.environ.get("PYTHONPATH")] if p])
_GROUPED = "tests.core.grouped_variant"


def _docs_table():
  """{name: row cells} of the variants table in docs/architecture.md."""
  text = (ROOT / "docs" / "architecture.md").read_text()
  section = text.split("## The attention variants: one registry")[1]
  section = section.split("\n#")[0]
  rows = {}
  for line in section.splitlines():
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    if line.startswith("| `"):
      rows[cells[0].strip("`")] = cells
  return rows


def _options_cell(record):
  return ", ".join(f"`{key}={value!r}`"
                   for key, value in record.options.items()) or "-"


def test_the_docs_table_is_the_registry():
  rows = _docs_table()
  assert list(rows) == list(variants.names())
  for record in variants.all_variants():
    yes = lambda flag: "yes" if flag else "-"  # pylint: disable=cell-var-from-loop
    assert rows[record.name] == [
        f"`{record.name}`", f"`{record.layer}`", _options_cell(record),
        yes(record.pre_softmax), yes(record.post_softmax),
        yes(record.identity_start), record.mtf_layer or "-",
        record.source], record.name


def test_the_built_in_variants_and_what_they_take():
  assert variants.names() == ("multi_head", "talking_heads",
                              "project_logits", "project_weights", "dynamic",
                              "general_bilinear", "gated", "gated_headwise",
                              "differential", "dcmha")
  assert variants.identity_starts() == variants.names()[:5] + ("dcmha",)
  dynamic = variants.get("dynamic")
  assert dynamic.takes_head_counts and not dynamic.takes_dynamic_projections
  assert variants.get("project_logits").takes_dynamic_projections
  assert not variants.get("multi_head").takes_head_counts
  with pytest.raises(ValueError, match=r"project_weights has no P_l\[h_k, h\]"):
    variants.get("project_weights").check_heads(4, 2, None, owner="x")


@pytest.mark.parametrize("record, message", [
    (lambda: variants.Variant(name="my variant", source="s", summary="s",
                              layer="MultiHeadAttention"),
     "must be a Python identifier"),
    (lambda: variants.Variant(name="mine", source="s", summary="s",
                              layer={"keras3": "my_module:Layer"}),
     r"layer must map each front end \['tf_keras', 'keras3'\]"),
    (lambda: variants.register(variants.Variant(
        name="talking_heads", source="mine", summary="s",
        layer="TalkingHeadsAttention")),
     r"'talking_heads' is already registered \(Shazeer"),
    (lambda: variants.get("softmax"),
     r"Unknown attention variant 'softmax'; expected one of 'multi_head'"),
    (lambda: variants.unregister("multi_head"),
     "'multi_head' is a built-in attention variant"),
    (lambda: variants.import_modules(["no_such_module_here"]),
     "Could not import the attention module 'no_such_module_here'"),
])
def test_bad_registrations_name_what_is_wrong(record, message):
  with pytest.raises(ValueError, match=message):
    record()


@pytest.fixture
def grouped():
  """The user's variant, registered for one test and removed after it."""
  variants.import_modules([_GROUPED])
  sys.modules.pop(_GROUPED)  # so a later import registers it again
  yield variants.get("grouped_talking_heads")
  variants.unregister("grouped_talking_heads")


def test_a_registered_variant_builds_in_a_model(grouped):
  from thattn import models  # pylint: disable=g-import-not-at-top
  model = models.create_model("bert_tiny", attention=grouped.name,
                              num_heads=4)
  attention = [layer for layer in model.submodules
               if type(layer).__name__ == "TalkingHeadsAttention"]
  assert attention and all(layer.num_head_groups == 2 for layer in attention)
  # Grouped P_l stores G blocks of [h_k / G, h / G]: 2 x 2 x 2.
  logits = [w for w in model.weights if "pre_softmax_projection" in w.name]
  assert logits and all(w.shape == (2, 2, 2) for w in logits)
  from thattn.core import complexity  # pylint: disable=g-import-not-at-top
  shape = complexity.variant_shape(grouped.name, num_heads=4, d_model=16)
  assert shape.num_head_groups == 2 and shape.d_k == 4


def _command(model_dir, flags, *extra):
  return cli.command("train", f"--model_dir={model_dir}", "--deterministic",
                     "--train_steps=3", "--attention_module=custom_variant",
                     "--attention=residual_talking_heads", *flags, *extra)


def test_thattn_train_trains_the_custom_variant_on_both_backends(
    tmp_path, tiny_bert_flags):
  pytest.importorskip("jax")
  losses = {}
  for backend in ("keras", "keras3"):
    cli.run_ok(_command(tmp_path / backend, tiny_bert_flags,
                        f"--backend={backend}"), _ENV)
    losses[backend] = local_cluster.train_losses(str(tmp_path / backend))
  assert sorted(losses["keras"]) == [1, 2, 3]
  for step, loss in losses["keras"].items():
    np.testing.assert_allclose(losses["keras3"][step], loss, rtol=1e-4,
                               err_msg=f"step {step}")
  # The runs name the module, and a fresh process that only loads a run
  # (nothing imports custom_variant first) rebuilds its model from it.
  load = ("import sys; from thattn import models; "
          "model = models.load(sys.argv[1]); "
          "print(type(model.get_layer('block_0').attention).__name__)")
  for backend in ("keras", "keras3"):
    with open(tmp_path / backend / "run_config.json") as f:
      assert json.load(f)["attention_modules"] == ["custom_variant"]
    output = cli.run_ok(
        [sys.executable, "-c", load, str(tmp_path / backend)], _ENV)
    assert output.split()[-1] == "HeadMixingAttention", output


def test_thattn_train_names_an_unknown_variant_and_module(tmp_path,
                                                          tiny_bert_flags):
  result = forkserver.run(
      cli.command("train", f"--model_dir={tmp_path / 'x'}",
                  "--attention=grouped_talking_heads") +
      list(tiny_bert_flags), env=_ENV, capture_output=True, text=True,
      timeout=300, check=False)
  assert result.returncode != 0
  assert re.search(r"--attention: Unknown attention variant "
                   r"'grouped_talking_heads'", result.stderr), result.stderr
  assert not (tmp_path / "x").exists()
