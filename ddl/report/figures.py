"""Figure 2: training (top) and validation (bottom) loss against step, one line per row, per size."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .tables import row_label


def loss_curves(runs: pd.DataFrame, histories: pd.DataFrame, size: str, unit: str, out_dir: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    subset = runs[runs["params.model.size"] == size]
    fig, axes = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    for ax, key, label in ((axes[0], "train/loss", "training loss"), (axes[1], "val/loss", "validation loss")):
        for row, group in subset.groupby("row", sort=False):
            curve = histories[(histories["run_id"].isin(group["run_id"])) & (histories["key"] == key)]
            if curve.empty:
                continue
            mean = curve.groupby("step")["value"].mean()  # over seeds
            failed = (group["status"] != "FINISHED").all()
            ax.plot(mean.index, mean.values, label=row_label(row) + (" (not finished)" if failed else ""),
                    linestyle="--" if failed else "-", marker="o" if len(mean) < 4 else None)
        ax.set_ylabel(f"{label} ({unit})")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    axes[0].set_title(f"Loss curves, {size} models")
    axes[1].set_xlabel("step")
    fig.tight_layout()
    names = []
    for ext in ("png", "svg"):
        name = f"figure2_{size}.{ext}"
        fig.savefig(out_dir / name, dpi=110)
        names.append(name)
    plt.close(fig)
    return names
