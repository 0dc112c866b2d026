"""thattn-ablate: a tiny grid end to end, and its table's arithmetic."""

import json

import pytest

from tests import cli
from tests import forkserver
from tests.keras3 import processes
from thattn import tasks
from thattn.experiments import ablation

_ENV = processes.train_environment()


_GRID = ["--task=recall", "--heads=1,4", "--d_model=16", "--d_ff=32",
         "--num_layers=1", "--train_steps=8", "--batch_size=8",
         "--sequence_length=8", "--warmup_steps=2", "--eval_steps=1"]


def _ablate(out_dir, *flags):
  result = forkserver.run(
      [*cli.command("ablate"), *_GRID, *flags,
       f"--out_dir={out_dir}"],
      capture_output=True, text=True, env=_ENV, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.fixture(scope="module")
def keras_grid(tmp_path_factory):
  """(out_dir, result) of a tiny recall grid on the Keras backend."""
  pytest.importorskip("matplotlib")
  out_dir = tmp_path_factory.mktemp("keras_grid")
  return out_dir, _ablate(out_dir, "--seeds=0,1")


def _results(out_dir):
  with open(out_dir / "results.json") as f:
    return json.load(f)


def test_tiny_recall_grid_writes_table_plot_and_heatmaps(keras_grid):
  tmp_path, result = keras_grid
  table = (tmp_path / "table.md").read_text()
  assert table.count("\n") == 2 + 2 * 2  # header, rule, variant x heads
  assert "| talking_heads | 4 | 4 |" in table
  assert "(n=2)" in table
  for name in ("ln_ppl_vs_heads.png", "heatmaps_h1.png", "heatmaps_h4.png",
               "results.json"):
    assert (tmp_path / name).stat().st_size > 0
  assert len(_results(tmp_path)) == 8
  # A rerun reuses the finished runs.
  again = forkserver.run(result.args, capture_output=True, text=True,
                         env=_ENV, timeout=600, check=True)
  assert "[1/8]" not in again.stdout


def test_the_grid_on_keras3_matches_the_keras_grid(keras_grid, tmp_path):
  """--backend=keras3 (JAX): every run of seed 0 as the Keras backend's,
  held-out ln(PPL) and accuracy, and the heatmaps from its checkpoints."""
  pytest.importorskip("jax")
  _ablate(tmp_path, "--seeds=0", "--backend=keras3")
  want = {r["run"]: r for r in _results(keras_grid[0]) if r["seed"] == 0}
  got = {r["run"]: r for r in _results(tmp_path)}
  assert sorted(got) == sorted(want) and len(got) == 4
  for name, run in got.items():
    assert run["backend"] == "keras3" and want[name]["backend"] == "keras"
    for key in ("held_out_ln_ppl_before", "held_out_ln_ppl_after",
                "held_out_accuracy"):
      assert abs(run[key] - want[name][key]) <= 1e-4 * abs(want[name][key]), (
          name, key, run[key], want[name][key])
  assert (tmp_path / "heatmaps_h4.png").stat().st_size > 0


def test_rows_count_parameters_and_multiplies_from_complexity():
  grid = ablation.GridOptions(heads=(2, 8), seeds=(0, 1), d_model=64)
  results = [dict(variant=v, heads=h, seed=s, step_ms=10.0 + s,
                  held_out_ln_ppl_after=5.0 + s)
             for v in grid.variants for h in grid.heads for s in grid.seeds]
  rows = ablation.aggregate(results, grid, sequence_length=64)
  by_key = {(r["variant"], r["heads"]): r for r in rows}
  multi, talking = by_key["multi_head", 8], by_key["talking_heads", 8]
  # Equal parameters but for P_l and P_w, h^2 each (the paper's Table 1).
  assert talking["parameters"] - multi["parameters"] == 2 * 8 * 8
  assert multi["parameters"] == by_key["multi_head", 2]["parameters"]
  assert talking["multiplies"] > multi["multiplies"]
  assert multi["ln_ppl_mean"] == 5.5 and multi["step_ms"] == 10.5
  assert abs(multi["ln_ppl_std"] - 0.7071) < 1e-3
  assert multi["difference_mean"] is None
  assert talking["difference_mean"] == 0.0 and talking["difference_std"] == 0
  table = ablation.markdown_table(rows)
  assert "| talking_heads | 8 | 8 | " in table and "accuracy" not in table
  # Recall reports accuracy too: the table gains a column for it.
  for r in results:
    r["held_out_accuracy"] = 0.25 + 0.5 * r["seed"]
  rows = ablation.aggregate(results, grid, sequence_length=64)
  assert rows[0]["accuracy_mean"] == 0.5
  assert abs(rows[0]["accuracy_std"] - 0.3536) < 1e-3
  assert "| 0.500 ± 0.354 | 10 |" in ablation.markdown_table(rows)


def test_matched_parameters_lower_d_ff_by_what_attention_adds():
  """--match_parameters: each variant's model has multi-head attention's
  parameters at the same h, within one feed-forward unit per layer
  (lm_tiny's gated network without biases: 3 d_model)."""
  from thattn import models  # pylint: disable=g-import-not-at-top
  grid = ablation.GridOptions(
      task="causal_lm", heads=(4,), d_model=32, d_ff=96,
      variants=("multi_head", "talking_heads", "dcmha", "gated",
                "differential"), match_parameters=True)
  counts = {}
  for variant in grid.variants:
    options = ablation._model(grid, variant, 4)  # pylint: disable=protected-access
    counts[variant] = models.create_model(
        options.preset, **options.overrides).count_params()
    if variant == "dcmha":  # D_1 [32, 4, 16], Q_kw [4, 16, 4, 4], D_d
      assert options.overrides["d_ff"] == 96 - round(3584 / 96)
  for variant, count in counts.items():
    assert abs(count - counts["multi_head"]) <= 2 * 3 * 32 // 2, variant
  with pytest.raises(ValueError, match="dcmha at h=4 adds 3,584 parameters "
                                       "per layer, more than"):
    ablation.GridOptions(task="causal_lm", heads=(4,), d_model=32, d_ff=16,
                         variants=("dcmha",), match_parameters=True)


def test_grid_errors():
  with pytest.raises(ValueError, match="heads=3 does not divide d_model=64"):
    ablation.GridOptions(heads=(3,))
  with pytest.raises(ValueError, match="task 'squad' fine-tunes; expected "
                     "one of mlm, span_corruption, causal_lm, prefix_lm, "
                     "recall"):
    ablation.GridOptions(task="squad")
  # lm_tiny's 2 shared key and value heads do not divide 3 heads: named
  # before any run trains.
  with pytest.raises(ValueError, match="num_key_value_heads=2 must divide"):
    ablation.GridOptions(task="causal_lm", heads=(3,), d_model=48)
  with pytest.raises(ValueError, match="Unknown task 'nonsense'"):
    ablation.GridOptions(task="nonsense")
  assert tasks.names()  # the grid trains through the trainer
