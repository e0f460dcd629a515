"""Figure 2: training (top) and validation (bottom) loss against step, one line per row, per size; and
the Delta diagnostics by layer at the end of training (beta, the state's effective rank), one line per run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .tables import row_label, trial_values


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, stem: str, out_dir: Path) -> list[str]:
    names = []
    for ext in ("png", "svg"):
        fig.savefig(out_dir / f"{stem}.{ext}", dpi=110)
        names.append(f"{stem}.{ext}")
    return names


def loss_curves(runs: pd.DataFrame, histories: pd.DataFrame, size: str, unit: str, out_dir: Path) -> list[str]:
    plt = pyplot()
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
    names = save_figure(fig, f"figure2_{size}", out_dir)
    plt.close(fig)
    return names


def _by_layer(run: pd.Series, pattern: str) -> pd.Series:
    """The run's latest values of the metrics matching `pattern` (a regex with one group: the layer)."""
    values = run.filter(regex=f"^metrics\\.{pattern}$").dropna()
    if values.empty:
        return values
    layers = values.index.str.extract(f"^metrics\\.{pattern}$", expand=False)
    return values.astype(float).groupby(layers.values).mean().sort_index()


def layer_diagnostics(runs: pd.DataFrame, size: str, out_dir: Path) -> list[str]:
    """Per layer at the end of training: beta's mean over the layer's sublayers and Delta steps (top)
    and the effective rank of the state X (bottom, only where a run has d_v > 1), one line per finished
    DDL run: a colour per row, a line style per seed."""
    subset = runs[(runs["params.model.size"] == size) & (runs["status"] == "FINISHED")]
    curves = [(run, _by_layer(run, r"beta/L(\d+)\.\w+(?:\.j\d+)?/mean"), _by_layer(run, r"erank/L(\d+)"))
              for _, run in subset.iterrows()]
    curves = [c for c in curves if not c[1].empty]
    if not curves:
        return []
    plt = pyplot()
    ranked = any(not rank.empty for _, _, rank in curves)
    fig, axes = plt.subplots(1 + ranked, 1, figsize=(8, 8 if ranked else 4.5), sharex=True, squeeze=False)
    axes = axes[:, 0]
    colours = {row: f"C{i % 10}" for i, row in enumerate(dict.fromkeys(sorted(run["row"] for run, _, _ in curves)))}
    seeds = {seed: i for i, seed in enumerate(sorted({run["params.seed"] for run, _, _ in curves}))}
    for run, beta, rank in sorted(curves, key=lambda c: (c[0]["row"], c[0]["params.seed"])):
        dashes = ("-", "--", ":", "-.")[seeds[run["params.seed"]] % 4]
        style = dict(marker="o", color=colours[run["row"]], linestyle=dashes,
                     label=f"{row_label(run['row'])} s{run['params.seed']}")
        axes[0].plot(beta.index.astype(int), beta.values, **style)
        if not rank.empty:
            axes[1].plot(rank.index.astype(int), rank.values, **style)
    axes[0].set_ylabel("beta (mean over tokens, sublayers, steps)")
    if ranked:
        axes[1].set_ylabel("effective rank of X (d_v > 1)")
    axes[-1].set_xlabel("layer")
    axes[-1].xaxis.get_major_locator().set_params(integer=True)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small", ncol=2)
    axes[0].set_title(f"Delta diagnostics by layer at the end of training, {size} models")
    fig.tight_layout()
    names = save_figure(fig, f"diagnostics_{size}", out_dir)
    plt.close(fig)
    return names


def _searched_keys(runs: pd.DataFrame) -> list[str]:
    """The keys a search's trials varied (a size whose rows were carried from another has none), and train.lr
    where a row's finished runs outside any search differ in it (a plain list)."""
    trials = runs[runs.get("tags.ddl.role", pd.Series(index=runs.index, dtype=object)) == "trial"]
    keys = list(dict.fromkeys(k for values in trial_values(trials) for k in values))
    plain = runs[(runs["status"] == "FINISHED") & runs.get("tags.ddl.search", pd.Series(index=runs.index)).isna()]
    if "params.train.lr" in runs and "train.lr" not in keys and \
            plain.groupby("params.model.row")["params.train.lr"].nunique().gt(1).any():
        keys.append("train.lr")
    return keys


def _x(runs: pd.DataFrame, key: str) -> pd.Series:
    """Each run's value of `key`: its searched value, else its param (a plain sweep's list)."""
    params = runs.get(f"params.{key}", runs.get(f"params.model.{key}", pd.Series(index=runs.index, dtype=object)))
    values = [v.get(key, p) for v, p in zip(trial_values(runs), params, strict=True)]
    return pd.to_numeric(pd.Series(values, index=runs.index), errors="coerce")


def sensitivity(runs: pd.DataFrame, size: str, unit: str, out_dir: Path) -> list[str]:
    """Final validation loss against each searched value, a line per row through its finished runs (mean over
    seeds), every trial a point, pruned trials an x at their last validation loss; a log axis where the values
    span a factor of 4 or more."""
    subset = runs[runs["params.model.size"] == size]
    keys = _searched_keys(subset)
    if not keys:
        return []
    plt = pyplot()
    fig, axes = plt.subplots(1, len(keys), figsize=(7 * len(keys), 4.8), squeeze=False)
    pruned = subset.get("tags.ddl.pruned", pd.Series(index=subset.index, dtype=object)).notna() \
        & (subset["status"] != "FINISHED")                  # a pruned trial the bracket finished is a point
    for ax, key in zip(axes[0], keys, strict=True):
        x = _x(subset, key)
        for i, (row, group) in enumerate(subset.groupby("params.model.row", sort=True)):
            colour = f"C{i % 10}"
            done = group[(group["status"] == "FINISHED") & x[group.index].notna()]
            curve = done.groupby(x[done.index])["metrics.final/val/loss"].mean().sort_index()
            ax.plot(curve.index, curve.values, marker="o", color=colour, label=row_label(row))
            stopped = group[pruned[group.index] & x[group.index].notna()]
            if len(stopped) and "metrics.val/loss" in stopped:
                ax.scatter(x[stopped.index], stopped["metrics.val/loss"], marker="x", color=colour,
                           label=f"{row_label(row)}: pruned (last val loss)")
        values = x.dropna()
        if len(values) and values.min() > 0 and values.max() >= 4 * values.min():
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(f"final validation loss ({unit})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0][0].set_title(f"Sensitivity, {size} models")
    fig.tight_layout()
    names = save_figure(fig, f"sensitivity_{size}", out_dir)
    plt.close(fig)
    return names
