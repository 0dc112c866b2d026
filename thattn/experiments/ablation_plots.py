"""thattn-ablate's figures (matplotlib, imported only here).

- `ln_ppl_vs_heads`: held-out ln(PPL) against the number of heads, one line
  per variant, with the standard deviation over seeds as error bars.
- `heatmaps`: P_l [h_k, h], P_w [h, h_v] and their product P_l x P_w
  [h_k, h_v] of one talking-heads layer, as in the paper's Figure 1.
"""

import os

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
from matplotlib import pyplot  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position


def ln_ppl_vs_heads(out_dir, rows, grid):
  """Writes ln_ppl_vs_heads.png and returns its file name."""
  figure, axes = pyplot.subplots(figsize=(6, 4))
  for variant in grid.variants:
    mine = [row for row in rows if row["variant"] == variant]
    axes.errorbar([row["heads"] for row in mine],
                  [row["ln_ppl_mean"] for row in mine],
                  yerr=[row["ln_ppl_std"] for row in mine], marker="o",
                  capsize=3, label=variant)
  axes.set_xscale("log", base=2)
  axes.set_xticks(list(grid.heads), [str(h) for h in grid.heads])
  axes.set_xlabel(f"heads h (d_k = {grid.d_model} / h)")
  axes.set_ylabel("held-out ln(PPL)")
  axes.set_title(f"{grid.task}: d_model {grid.d_model}, {grid.num_layers} "
                 f"layers, {len(grid.seeds)} seeds")
  axes.legend()
  figure.tight_layout()
  name = "ln_ppl_vs_heads.png"
  figure.savefig(os.path.join(out_dir, name), dpi=120)
  pyplot.close(figure)
  return name


def heatmaps(out_dir, heads, p_l, p_w):
  """Writes heatmaps_h<heads>.png of P_l, P_w, P_l x P_w; returns the name."""
  figure, axes = pyplot.subplots(1, 3, figsize=(12, 4))
  matrices = ((p_l, "P_l [h_k, h]", "h", "h_k"),
              (p_w, "P_w [h, h_v]", "h_v", "h"),
              (np.matmul(p_l, p_w), "P_l x P_w [h_k, h_v]", "h_v", "h_k"))
  for axis, (matrix, title, x_label, y_label) in zip(axes, matrices):
    limit = float(np.abs(matrix).max()) or 1.0
    image = axis.imshow(matrix, cmap="RdBu_r", vmin=-limit, vmax=limit)
    axis.set_title(title)
    axis.set_xlabel(x_label)
    axis.set_ylabel(y_label)
    figure.colorbar(image, ax=axis, fraction=0.046)
  figure.suptitle(f"Learned talking-heads projections, first layer, h={heads}")
  figure.tight_layout()
  name = f"heatmaps_h{heads}.png"
  figure.savefig(os.path.join(out_dir, name), dpi=120)
  pyplot.close(figure)
  return name
