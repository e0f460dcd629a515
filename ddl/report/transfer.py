"""Does the best learning rate carry along one axis (width, depth or training length)? For an experiment that
trained one row at several values of one axis over a list of learning rates (sweeps/transfer*.yaml): per row,
parameterization and axis value, the lr of the lowest final validation loss (the mean over its seeds), its
loss and seeds, and how many factor-2 steps it lies from the axis' first value's best (lr_transfer.md/.csv,
the console); and Yang et al.'s transfer figure, loss against lr, a line per axis value (lr_transfer.png).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..stats import slope
from .figures import pyplot, save_figure
from .tables import row_label

LR, LOSS = "params.train.lr", "metrics.final/val/loss"
# axis -> its column; width and depth name a size (one of them varies, the other not), the horizon its steps
AXES = {"width": "params.model.d_model", "depth": "params.model.n_layer", "horizon": "params.train.steps"}
# what tells a line's runs apart beyond the axis, the lr and the seed: column -> (name, the value of a run that
# logged no such param: one from before the key, or the multipliers at their default); µP's two base-width
# multipliers (sweeps/mup_multipliers.yaml scans them) included
SETTINGS = {"params.model.row": ("row", ""), "params.model.param": ("param", "sp"),
            "params.model.depth_param": ("depth_param", "none"), "params.model.logit_mult": ("logit_mult", "1.0"),
            "params.model.embed_lr_mult": ("embed_lr_mult", "1.0")}
LINE = [name for name, _ in SETTINGS.values()]
PANELS_A_ROW = 4


def transfer_axis(runs: pd.DataFrame) -> str | None:
    """The axis the finished runs vary along: width or depth where exactly one of them takes two values or more
    (the horizon may grow with them: a token budget per parameter), the horizon where neither does; None
    without two learning rates or where width and depth both vary (sizes: the view across sizes)."""
    done = runs[runs["status"] == "FINISHED"]
    if any(col not in done for col in (LR, LOSS, *AXES.values())) or done[LR].nunique() < 2:
        return None
    varying = [axis for axis, col in AXES.items() if done[col].nunique() > 1]
    sized = [axis for axis in varying if axis != "horizon"]
    if len(sized) == 1:
        return sized[0]
    return "horizon" if varying == ["horizon"] else None


def _curves(runs: pd.DataFrame, axis: str) -> pd.DataFrame:
    """One line per setting, axis value and lr: the mean final loss over its seeds and their number."""
    done = runs[runs["status"] == "FINISHED"]
    done = done.assign(**{name: done.get(col, pd.Series(index=done.index, dtype=object)).fillna(earlier)
                          for col, (name, earlier) in SETTINGS.items()},
                       value=pd.to_numeric(done[AXES[axis]]), lr=pd.to_numeric(done[LR]))
    for name in ("logit_mult", "embed_lr_mult"):        # "1" and "1.0" are one setting
        done[name] = pd.to_numeric(done[name])
    return done.groupby([*LINE, "value", "lr"])[LOSS].agg(["mean", "count"]).reset_index()


def _line(row: str, param: str, depth_param: str, logit_mult: float, embed_lr_mult: float) -> str:
    return " ".join(filter(None, (row_label(row), param, depth_param != "none" and depth_param,
                                  logit_mult != 1 and f"logits x{logit_mult:g}",
                                  embed_lr_mult != 1 and f"embedding lr x{embed_lr_mult:g}")))


def vertex(lrs: list[float], losses: list[float]) -> float:
    """The lr at the vertex of the parabola fitted (least squares) to (log2 lr, loss) around a minimum, kept
    within the points: an optimum between grid points, less moved by one noisy point than the argmin."""
    x = np.log2(lrs)
    a, b, _ = np.polyfit(x, losses, 2)
    return float(2 ** np.clip(-b / (2 * a), x.min(), x.max())) if a > 0 else lrs[int(np.argmin(losses))]


def transfer_table(runs: pd.DataFrame, axis: str) -> pd.DataFrame:
    """Per line (row, param, depth_param, the multipliers) and axis value: the best lr, its loss and seeds, the
    seeds of its two grid neighbours, its distance in factor-2 steps from the first value's best, whether it is
    the lowest or highest lr tried there (the optimum may lie beyond), and the vertex of the parabola through it
    and its neighbours, two each side where there are (the best lr itself at an edge)."""
    records = []
    for setting, line in _curves(runs, axis).groupby(LINE):
        first = None
        for value, at in line.groupby("value"):
            at = at.sort_values("lr").reset_index(drop=True)
            i = int(at["mean"].idxmin())
            best = at.loc[i]
            first = best["lr"] if first is None else first
            neighbours = [int(at.loc[j, "count"]) for j in (i - 1, i + 1) if 0 <= j < len(at)]
            edge = i in (0, len(at) - 1)
            around = at.loc[max(0, i - 2):i + 2]
            records.append(dict(line=_line(*setting), **dict(zip(LINE, setting, strict=True)), axis=axis,
                                value=int(value), best_lr=best["lr"], loss=best["mean"], seeds=int(best["count"]),
                                neighbour_seeds=min(neighbours, default=0),
                                steps=round(math.log2(best["lr"] / first), 2), edge=edge,
                                vertex=best["lr"] if edge else vertex(list(around["lr"]), list(around["mean"]))))
    return pd.DataFrame(records)


def exponents(table: pd.DataFrame) -> dict[str, object]:
    """Per line: the slope of log best lr (the parabola's vertex) on log axis value, with its 95% interval: best
    lr ∝ value^slope (ddl.stats.slope; no interval under three values)."""
    return {name: slope([math.log(v) for v in line["value"]], [math.log(lr) for lr in line["vertex"]])
            for name, line in table.groupby("line", sort=False) if line["value"].nunique() > 1}


def summaries(table: pd.DataFrame) -> list[str]:
    """One line per line of the table: how many factor-2 steps its best lr moves from the axis' first value to
    its last, and the fitted exponent."""
    out, fitted = [], exponents(table)
    for name, line in table.groupby("line", sort=False):
        ends = line.sort_values("value")
        first, last = ends.iloc[0], ends.iloc[-1]
        if len(ends) == 1:
            out.append(f"{name}: only {first['axis']} {first['value']} measured (best lr {first['best_lr']:.3g})")
            continue
        edge = " (a best at the edge of its grid)" if ends["edge"].any() else ""
        fit = fitted.get(name)
        law = "" if fit is None else f"; best lr ∝ {first['axis']}^{fit.value:+.2f}" + (
            "" if fit.low is None else f" [{fit.low:+.2f}, {fit.high:+.2f}]")
        out.append(f"{name}: {last['steps']:+g} factor-2 steps from {first['axis']} {first['value']} to "
                   f"{last['value']} ({first['best_lr']:.3g} -> {last['best_lr']:.3g}){edge}{law}")
    return out


HEADERS = ["line", "axis value", "best lr", "vertex", "loss (mean)", "seeds at best / neighbours", "factor-2 steps"]


def rows(table: pd.DataFrame) -> list[list[str]]:
    return [[r.line, str(r.value), f"{r.best_lr:.3g}" + (" (edge)" if r.edge else ""), f"{r.vertex:.3g}",
             f"{r.loss:.4f}", f"{r.seeds} / {r.neighbour_seeds}", f"{r.steps:+g}"] for r in table.itertuples()]


def markdown(table: pd.DataFrame, unit: str) -> str:
    axis = table["axis"].iloc[0]
    lines = [f"### The best learning rate along {axis}", "", "| " + " | ".join(HEADERS) + " |",
             "|---" * len(HEADERS) + "|", *["| " + " | ".join(r) + " |" for r in rows(table)], "",
             f"Final validation loss in {unit}, the mean over seeds; factor-2 steps: log2 of the best lr over the "
             f"first {axis} value's. Vertex: of the parabola fitted to the best and two grid points each side in "
             f"log lr. Neighbours: the fewer seeds of the two grid points beside the best. The exponent: least "
             f"squares of log vertex on log {axis}, 95% t interval.", "",
             *[f"- {line}" for line in summaries(table)], ""]
    return "\n".join(lines)


def figure(runs: pd.DataFrame, axis: str, unit: str, out_dir: Path) -> list[str]:
    """Final validation loss against the learning rate, a line per axis value, a panel per line of the table
    (Yang et al.'s transfer figure): where the lr carries, the minima line up."""
    curves = _curves(runs, axis)
    panels = list(curves.groupby(LINE))
    plt = pyplot()
    ncols = min(len(panels), PANELS_A_ROW)
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 4.2 * nrows), squeeze=False, sharey=True)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (setting, panel) in zip(axes.flat[:len(panels)], panels, strict=True):
        for i, (value, line) in enumerate(panel.groupby("value")):
            best = line.loc[line["mean"].idxmin(), "lr"]
            ax.plot(line["lr"], line["mean"], marker="o", color=f"C{i}", label=f"{axis} {value:g}: best {best:.3g}")
        lrs = sorted(panel["lr"].unique())
        ax.set_xscale("log")
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs], minor=False, rotation=45)
        ax.minorticks_off()
        ax.set_xlabel("learning rate")
        ax.set_title(_line(*setting))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for row_axes in axes:
        row_axes[0].set_ylabel(f"final validation loss ({unit})")
    fig.tight_layout()
    names = save_figure(fig, "lr_transfer", out_dir)
    plt.close(fig)
    return names


def write(runs: pd.DataFrame, unit: str, out_dir: Path) -> tuple[pd.DataFrame | None, list[str]]:
    """lr_transfer.md/.csv and the figure, where the runs vary along one axis: (the table, the figures)."""
    axis = transfer_axis(runs)
    if axis is None:
        return None, []
    table = transfer_table(runs, axis)
    (out_dir / "lr_transfer.md").write_text(markdown(table, unit))
    (out_dir / "lr_transfer.csv").write_text(table.drop(columns=["row"]).to_csv(index=False))
    return table, figure(runs, axis, unit, out_dir)
