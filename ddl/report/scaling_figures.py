"""The figures across sizes: each row's relative gap to its baseline against N (ours with 95% intervals,
the paper's points, the fitted gap extrapolated), and validation loss against N in log-log with each
row's power law."""

from __future__ import annotations

from pathlib import Path

from .figures import pyplot, save_figure
from .scaling import PAPER_N, CrossSize
from .tables import row_label


def _colours(rows) -> dict[str, str]:
    return {row: f"C{i % 10}" for i, row in enumerate(dict.fromkeys(rows))}


def gap_figure(view: CrossSize, out_dir: Path) -> list[str]:
    """Relative difference to the baseline (%) against N: ours (filled, 95% interval where two seeds or more),
    the paper's (open squares), the fitted gap (solid over our sizes, dotted where extrapolated, x at the
    paper's N, in the shaded part). Nothing without a row paired with its baseline."""
    ours = [p.n for p in view.points if p.difference is not None]
    if not ours:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colours = _colours(p.row for p in view.points)
    for p in view.points:
        style = dict(color=colours[p.row], linestyle="none")
        if p.difference is None:
            ax.plot(p.n, p.relative, marker="s", markerfacecolor="none", markersize=8, **style)
        else:
            _bar(ax, p.n, p.relative, p.interval, marker="o", **style)
    _fitted_gaps(ax, view, colours, min(ours), max(ours))
    handles = [plt.Line2D([], [], color=c, marker="o", linestyle="none", label=row_label(r))
               for r, c in colours.items()]
    handles += [plt.Line2D([], [], color="gray", marker=m, markerfacecolor=f, linestyle=ls, label=text)
                for m, f, ls, text in (("o", "gray", "none", "ours (95% CI)"), ("s", "none", "none", "paper"),
                                       ("x", "gray", ":", "fitted gap, EXTRAPOLATED"))]
    ax.axhline(0, color="black", linewidth=0.8)
    if max(ours) < max(PAPER_N.values()):
        ax.axvspan(max(ours), max(PAPER_N.values()) * 1.5, color="gray", alpha=0.08)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("final validation loss vs baseline (%)")
    ax.set_title(f"Gain over the baseline across sizes (shaded: beyond ours, {', '.join(view.sizes)})")
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize="small")
    fig.tight_layout()
    names = save_figure(fig, "scaling_gap", out_dir)
    plt.close(fig)
    return names


def _bar(ax, x: float, y: float, interval: tuple[float, float] | None, **style) -> None:
    low, high = interval or (y, y)
    ax.errorbar(x, y, yerr=[[y - low], [high - y]], capsize=3, **style)


def _fitted_gaps(ax, view: CrossSize, colours: dict[str, str], first: float, last: float) -> None:
    """Each row's fitted gap: solid over the measured N, dotted beyond, x (with its interval) at the paper's N."""
    for row, colour in colours.items():
        gaps = [g for g in view.gaps if g.row == row]
        if not gaps:
            continue
        ax.plot([first, last], [gaps[0].at(first), gaps[0].at(last)], color=colour, linewidth=1)
        far = max(PAPER_N.values())
        if last < far:
            ax.plot([last, far], [gaps[0].at(last), gaps[0].at(far)], color=colour, linewidth=1, linestyle=":")
        for g in gaps:
            _bar(ax, PAPER_N[g.size], g.relative, g.interval, marker="x", color=colour, linestyle="none", alpha=0.6)


def loss_figure(view: CrossSize, out_dir: Path) -> list[str]:
    """Final validation loss against N (log-log), every seed a point, each row's fitted power law; nothing
    without a fit."""
    if not view.fits:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colours = _colours([f.row for f in view.fits])
    for fit in view.fits:
        points = view.losses[fit.row]
        ns = sorted({n for n, _ in points})
        ax.plot([n for n, _ in points], [v for _, v in points], marker="o", linestyle="none", alpha=0.6,
                color=colours[fit.row])
        grid = [ns[0] * (ns[-1] / ns[0]) ** (i / 40) for i in range(41)]
        ax.plot(grid, [fit.loss(n) for n in grid], color=colours[fit.row],
                label=f"{row_label(fit.row)}: {fit.form}, alpha={fit.alpha:.3f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel(f"final validation loss ({view.unit})")
    ax.set_title("Validation loss against N, a power law per row")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    fig.tight_layout()
    names = save_figure(fig, "scaling_loss", out_dir)
    plt.close(fig)
    return names
