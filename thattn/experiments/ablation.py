"""thattn-ablate's library: attention variant x heads at constant parameters.

`run_grid(...)` trains one small model per (variant, heads, seed) with
`thattn.training.trainer`, keeping h * d_k = d_model as in the paper's Table 1,
so that multi-head attention has the same parameters at every head count
and talking heads adds only P_l and P_w (h^2 each). With
`match_parameters`, every variant's feed-forward width is lowered by what
its attention layers add (the gate's P_g, DCMHA's kernels, P_l and P_w),
so that each model has multi-head attention's parameters at the same h
within one feed-forward unit per layer (`matched_d_ff`). It writes, in
out_dir:

- `runs/<variant>_h<h>_s<seed>/`: each run's model_dir (a rerun skips the
  finished runs and resumes an interrupted one);
- `results.json`: every run's summary;
- `table.md`: held-out ln(PPL) mean +- std over seeds, its difference from
  multi-head attention paired by seed, step time, and the parameters and
  multiplies per attention layer (`thattn.core.complexity`);
- `ln_ppl_vs_heads.png`: ln(PPL) against heads, one line per variant;
- `heatmaps_h<h>.png`: the learned P_l, P_w and P_l x P_w of the first
  talking-heads layer (seed 0), as in the paper's Figure 1.

`options.backend` may be keras or keras3 (Keras 3 models, on the
framework KERAS_BACKEND names; `thattn-ablate --backend=keras3`): the two
train every run from the same initial weights and batches.

The plots need matplotlib (the `[plot]` extra); without it the
table and results are still written.
"""

import dataclasses
import json
import os
import re
import statistics

import numpy as np
import tf_keras

from thattn.io import checkpoint_reading
from thattn.core import complexity
from thattn.core import requirements
from thattn import models
from thattn import tasks
from thattn.training import options as options_lib
from thattn.io import run_dir
from thattn.training import trainer

@dataclasses.dataclass(frozen=True)
class GridOptions:
  """The grid and the size of every run in it."""
  task: str = "mlm"
  variants: tuple = ("multi_head", "talking_heads")
  heads: tuple = (2, 4, 8, 16)
  seeds: tuple = (0, 1, 2)
  preset: str = None  # None: the task's default preset (bert_tiny for mlm)
  d_model: int = 64
  d_ff: int = 256
  num_layers: int = 2
  match_parameters: bool = False

  def __post_init__(self):
    if not tasks.get(self.task).pretraining:  # get: unknown names listed
      pretraining = [name for name in tasks.names()
                     if tasks.get(name).pretraining]
      raise ValueError(f"The ablation trains from scratch, but task "
                       f"{self.task!r} fine-tunes; expected one of "
                       f"{', '.join(pretraining)}.")
    for h in self.heads:
      if self.d_model % h:
        raise ValueError(f"heads={h} does not divide d_model="
                         f"{self.d_model}; the grid keeps h * d_k = d_model.")
    if not (self.variants and self.heads and self.seeds):
      raise ValueError("variants, heads and seeds must not be empty.")
    # Every run's model, checked before the first trains (a preset's shared
    # key and value heads must divide each h, say).
    for variant in self.variants:
      for h in self.heads:
        tasks.get(self.task).check_model(_model(self, variant, h))


def run_name(variant, heads, seed):
  return f"{variant}_h{heads}_s{seed}"


def _model(grid, variant, heads, d_ff=None):
  overrides = {"attention": variant, "num_heads": heads,
               "d_model": grid.d_model, "num_layers": grid.num_layers,
               "d_ff": d_ff or grid.d_ff}
  task_class = tasks.get(grid.task)
  if task_class.supports_dropout:
    overrides["dropout_rate"] = 0.0  # the paper's pretraining recipe
  preset = (grid.preset or task_class.default_preset
            if task_class.default_preset else None)
  if d_ff is None and grid.match_parameters:
    overrides["d_ff"] = matched_d_ff(
        grid, variant, heads,
        models.model_config(preset, **overrides) if preset else None)
  return tasks.ModelOptions(preset=preset, overrides=overrides)


def matched_d_ff(grid, variant, heads, config):
  """The feed-forward width at which a `variant` model has multi-head
  attention's parameters at h = `heads`: `grid.d_ff` less the parameters
  its attention layer adds, over a feed-forward unit's (2 d_model, 3 with
  a gated network, and its bias; a model without a preset, recall's
  encoder, has a plain network with biases)."""
  extra = (complexity.parameters(attention_shape(variant, heads,
                                                 grid.d_model, 1)) -
           complexity.parameters(attention_shape("multi_head", heads,
                                                 grid.d_model, 1)))
  gated = bool(config and getattr(config, "gated_feed_forward", False))
  per_unit = (3 if gated else 2) * grid.d_model + bool(
      config is None or getattr(config, "use_bias", True))
  d_ff = grid.d_ff - round(extra / per_unit)
  if d_ff < 1:
    raise ValueError(
        f"match_parameters: {variant} at h={heads} adds {extra:,} "
        f"parameters per layer, more than the feed-forward width "
        f"d_ff={grid.d_ff} holds; give a larger --d_ff.")
  return d_ff


def run_grid(*, out_dir, grid=GridOptions(), options=None, data=None,
             log=print):
  """Trains every run of the grid (or reuses finished ones); returns them.

  options: the `TrainOptions` of every run (its seed is replaced).
  data: `tasks.DataOptions` for text tasks (default: the embedded corpus).
  """
  options = options or options_lib.TrainOptions()
  results = []
  total = len(grid.variants) * len(grid.heads) * len(grid.seeds)
  for variant in grid.variants:
    for heads in grid.heads:
      for seed in grid.seeds:
        name = run_name(variant, heads, seed)
        model_dir = os.path.join(out_dir, "runs", name)
        summary = _finished(model_dir, options.train_steps)
        if summary is None:
          log(f"[{len(results) + 1}/{total}] {name}")
          _clear_sessions(options)
          summary = trainer.train(
              model_dir=model_dir, task=grid.task,
              model=_model(grid, variant, heads), data=data,
              options=dataclasses.replace(options, seed=seed),
              log=lambda line: None)
          log(f"    held-out ln(PPL) {summary['held_out_ln_ppl_after']:.4f}"
              f", {summary['tokens_per_second']:,} tokens/s")
        results.append(dict(summary, variant=variant, heads=heads,
                            seed=seed, run=name,
                            step_ms=_step_ms(summary, options)))
  with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
  return results


def _clear_sessions(options):
  """Each run starts from a fresh Keras state (layer names, and for Keras 3
  its seed generators' count), as its own thattn-train process would."""
  tf_keras.backend.clear_session()
  if options.backend == options_lib.KERAS3:
    import keras  # pylint: disable=g-import-not-at-top
    keras.backend.clear_session()


def _finished(model_dir, train_steps):
  summary = run_dir.read_summary(model_dir)
  return summary if summary and summary["steps"] >= train_steps else None


def _step_ms(summary, options):
  """Milliseconds per training step after compilation, from tokens/s."""
  rate = summary["tokens_per_second"]
  tokens = options.batch_size * options.sequence_length
  return 1000.0 * tokens / rate if rate else float("nan")


def attention_shape(variant, heads, d_model, length):
  """The `thattn.core.complexity` shape of one attention layer of the grid."""
  return complexity.variant_shape(
      variant, num_heads=heads, d_model=d_model, query_length=length,
      memory_length=length)


def aggregate(results, grid, sequence_length):
  """One row per (variant, heads): means and stds over seeds."""
  rows = []
  for variant in grid.variants:
    for heads in grid.heads:
      runs = [r for r in results if r["variant"] == variant and
              r["heads"] == heads]
      values = [r["held_out_ln_ppl_after"] for r in runs]
      shape = attention_shape(variant, heads, grid.d_model, sequence_length)
      counted = [r["parameters"] for r in runs if "parameters" in r]
      rows.append({
          **_paired_difference(results, variant, heads),
          "variant": variant, "heads": heads,
          "d_k": grid.d_model // heads, "seeds": len(runs),
          "d_ff": _model(grid, variant, heads).overrides["d_ff"],
          "model_parameters": counted[0] if counted else None,
          "ln_ppl_mean": statistics.mean(values),
          "ln_ppl_std": statistics.stdev(values) if len(values) > 1 else 0.0,
          **_accuracy(runs),
          "step_ms": statistics.median(r["step_ms"] for r in runs),
          "parameters": complexity.parameters(shape),
          "multiplies": complexity.multiplies(shape),
      })
  return rows


def _accuracy(runs):
  """Held-out accuracy mean and std, for tasks that report it (recall)."""
  values = [r["held_out_accuracy"] for r in runs if "held_out_accuracy" in r]
  if not values or len(values) < len(runs):
    return {}
  return {"accuracy_mean": statistics.mean(values),
          "accuracy_std": (statistics.stdev(values) if len(values) > 1
                           else 0.0)}


def _paired_difference(results, variant, heads, baseline="multi_head"):
  """ln(PPL) minus the baseline's at the same heads and seed: mean, std.

  Runs with the same seed see the same batches and masks, so the paired
  difference cancels most of the seed-to-seed spread.
  """
  if variant == baseline:
    return {"difference_mean": None, "difference_std": None}
  by_seed = {(r["variant"], r["seed"]): r["held_out_ln_ppl_after"]
             for r in results if r["heads"] == heads}
  differences = [value - by_seed[baseline, seed]
                 for (name, seed), value in sorted(by_seed.items())
                 if name == variant and (baseline, seed) in by_seed]
  if not differences:
    return {"difference_mean": None, "difference_std": None}
  return {"difference_mean": statistics.mean(differences),
          "difference_std": (statistics.stdev(differences)
                             if len(differences) > 1 else 0.0)}


def markdown_table(rows):
  """The table.md text; an accuracy column when every row has one."""
  with_accuracy = all("accuracy_mean" in row for row in rows)
  accuracy_header = " held-out accuracy |" if with_accuracy else ""
  lines = ["| variant | h | d_k | d_ff | params (model) | params / att. "
           "layer | multiplies / att. layer | held-out ln(PPL) | minus "
           f"multi_head, same seed |{accuracy_header} step time (ms) |",
           "|---|---:|---:|---:|---:|---:|---:|---|---|" +
           ("---|" if with_accuracy else "") + "---:|"]
  for row in rows:
    difference = ("" if row["difference_mean"] is None else
                  f"{row['difference_mean']:+.3f} ± "
                  f"{row['difference_std']:.3f}")
    accuracy = (f" {row['accuracy_mean']:.3f} ± {row['accuracy_std']:.3f} |"
                if with_accuracy else "")
    model_parameters = ("-" if row["model_parameters"] is None else
                        f"{row['model_parameters']:,}")
    lines.append(
        f"| {row['variant']} | {row['heads']} | {row['d_k']} | "
        f"{row['d_ff']} | {model_parameters} | "
        f"{row['parameters']:,} | {row['multiplies']:,} | "
        f"{row['ln_ppl_mean']:.3f} ± {row['ln_ppl_std']:.3f} "
        f"(n={row['seeds']}) | {difference} |{accuracy} "
        f"{row['step_ms']:.0f} |")
  return "\n".join(lines) + "\n"


def projections(model_dir):
  """[(P_l, P_w)] per talking-heads layer, from model_dir's checkpoint
  (a Keras run's names are '/'-separated, a keras3 run's Orbax keys
  '.'-separated)."""
  values = checkpoint_reading.read_values(run_dir.latest_checkpoint(
      model_dir))
  layers = []
  for name in sorted(values, key=_natural):
    match = re.search(r"(^|[/.])pre_softmax_projection([/.]|$)", name)
    if match:
      partner = (name[:match.start()] + match.group(0).replace(
          "pre_softmax", "post_softmax") + name[match.end():])
      if partner in values:
        layers.append((values[name], values[partner]))
  return layers


def _natural(name):
  """Sort key that puts layer_with_weights-10 after layer_with_weights-9."""
  return [int(part) if part.isdigit() else part
          for part in re.split(r"(\d+)", name)]


def write_report(out_dir, results, grid, sequence_length, log=print):
  """Writes table.md and, with matplotlib, the plot and heatmaps."""
  rows = aggregate(results, grid, sequence_length)
  with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(markdown_table(rows))
  written = ["table.md"]
  try:
    from thattn.experiments import ablation_plots  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    log(f"No plots ({e}); {requirements.install_command('plot')} for them.")
    return rows, written
  written.append(ablation_plots.ln_ppl_vs_heads(out_dir, rows, grid))
  if "talking_heads" in grid.variants:
    for heads in grid.heads:
      run = os.path.join(out_dir, "runs",
                         run_name("talking_heads", heads, grid.seeds[0]))
      layers = projections(run)
      if layers:
        written.append(ablation_plots.heatmaps(out_dir, heads, *layers[0]))
  return rows, written


def product(p_l, p_w):
  """P_l x P_w [h_k, h_v]: logits heads mixed straight to value heads."""
  return np.matmul(p_l, p_w)
