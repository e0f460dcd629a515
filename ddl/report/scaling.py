"""Across sizes: does a row's gain over its baseline grow or vanish with the model?

Built from the loss table (its cells already hold each row's final validation loss per seed and its
difference to the baseline, paired by seed) and each run's parameter count:
- points: per row and size, the paired relative difference to the baseline with its 95% interval
  (the interval of the mean difference over the baseline's mean; none with one seed), the row's
  parameters and 6N FLOPs per token against the baseline's (a compute-matched reading), and the
  paper's relative difference at small and medium as points of their own;
- fits: per row, validation loss against non-embedding parameters N (Kaplan et al. 2020: every
  parameter but the tied embedding), each seed a point: loss = a N^-alpha + c where four sizes or more
  support three parameters and scipy's fit converges, else loss = a N^-alpha (a line in log-log);
- extrapolated gaps: per row, the per-seed log ratio log(L_row / L_baseline), linear in log N (the
  difference of two pure power laws), fitted and read at the paper's small and medium N, with the
  95% t interval of the fitted mean (n - 2 degrees of freedom): an extrapolation, far beyond the
  points on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..costs import training_flops
from ..stats import CONFIDENCE, Difference, t_quantile
from .tables import BASELINE, PAPER_SIZES, Table, baseline_rows

# Non-embedding parameters of the paper's sizes (Table 4's shapes, GPT-2's vocabulary tied; tests check
# them against ddl.model): where its points sit and where the gaps are extrapolated to.
PAPER_N = {"small": 84_956_928, "medium": 301_997_056}
PURE, SATURATING = "a·N^-alpha", "a·N^-alpha + c"


@dataclass(frozen=True)
class Point:
    """One row at one size against its baseline (ours), or the paper's (params and seeds unknown)."""
    row: str
    size: str
    n: int                            # the row's non-embedding parameters N
    difference: Difference | None     # paired by seed; None for the paper's points
    params_ratio: float | None = None   # the row's parameters / the baseline's (6N FLOPs per token alike)
    flops_per_token: float | None = None
    tokens: int | None = None
    paper_relative: float | None = None

    @property
    def relative(self) -> float | None:
        return self.paper_relative if self.difference is None else self.difference.relative

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95% interval of the relative difference (%), None with one seed or no spread."""
        d = self.difference
        if d is None or d.low is None or not d.reference:
            return None
        return 100.0 * d.low / abs(d.reference), 100.0 * d.high / abs(d.reference)


@dataclass(frozen=True)
class Fit:
    """loss = a N^-alpha (+ c) for one row; alpha_interval: its 95% interval (None without spare points)."""
    row: str
    form: str
    a: float
    alpha: float
    c: float
    alpha_interval: tuple[float, float] | None
    points: int
    sizes: int

    def loss(self, n: float) -> float:
        return self.a * n ** -self.alpha + self.c


@dataclass(frozen=True)
class Gap:
    """A row's fitted relative gap to its baseline (%) at the paper's size `size`: extrapolated."""
    row: str
    size: str
    relative: float
    interval: tuple[float, float] | None
    points: int
    slope: float                      # d log(L_row / L_baseline) / d log N
    intercept: float
    extrapolated: bool                # the paper's N lies outside the measured ones

    def at(self, n: float) -> float:
        return 100.0 * math.expm1(self.intercept + self.slope * math.log(n))


@dataclass
class CrossSize:
    sizes: list[str]
    points: list[Point]               # ours, in size order, then the paper's
    fits: list[Fit]
    gaps: list[Gap]
    unit: str
    losses: dict[str, list[tuple[float, float]]]   # row -> (N, final validation loss) per seed and size
    note: str = ""                    # which runs it pairs, where not every run (a search's: each row at its best)


def non_embedding(runs: pd.DataFrame) -> pd.Series:
    """N per run, from its logged parameter count less the tied embedding (vocab_size x d_model)."""
    number = {c: pd.to_numeric(runs.get(f"params.model.{c}"), errors="coerce") for c in ("params", "vocab_size",
                                                                                         "d_model")}
    return number["params"] - number["vocab_size"] * number["d_model"]


def _first(runs: pd.DataFrame, column: str) -> float | None:
    values = pd.to_numeric(runs[column], errors="coerce").dropna() if column in runs else pd.Series(dtype=float)
    return float(values.iloc[0]) if len(values) else None


def cross_size(runs: pd.DataFrame, loss: Table, sizes: list[str], unit: str, note: str = "") -> CrossSize | None:
    """The view across sizes from a loss table (table3's, or one of each row at its own best: `note` says so);
    None unless two sizes have a finished loss."""
    measured = [s for s in sizes if any(loss.cells[r, f"{s}/val_loss"].mean is not None for r in loss.rows)]
    if len(measured) < 2:
        return None
    runs = runs.assign(N=non_embedding(runs))
    measured.sort(key=lambda s: runs.loc[runs["params.model.size"] == s, "N"].median())   # by N, ascending
    points, losses, ratios = [], [], []
    for size in measured:
        _of_size(runs[runs["params.model.size"] == size], loss, size, points, losses, ratios)
    rows = list(dict.fromkeys(p.row for p in points))
    paper = [Point(row, size, PAPER_N[size], None, paper_relative=cell.paper_relative[size])
             for row in rows for size in PAPER_SIZES
             if size in (cell := loss.cells[row, f"{measured[0]}/val_loss"]).paper_relative]
    by_row = {row: [(n, v) for r, n, v in losses if r == row] for row in dict.fromkeys(r for r, _, _ in losses)}
    fits = [f for row, points_of_row in by_row.items() if (f := fit_power_law(row, points_of_row)) is not None]
    gaps = [g for row in rows for size in PAPER_SIZES
            if (g := extrapolate_gap(row, size, [(n, v) for r, n, v in ratios if r == row])) is not None]
    return CrossSize(measured, points + paper, fits, gaps, unit, by_row, note)


def _of_size(runs: pd.DataFrame, loss: Table, size: str, points: list, losses: list, ratios: list) -> None:
    """Adds one size's points, its (row, N, loss) per seed and its (row, the baseline's N, log ratio) per seed."""
    bases = baseline_rows(runs)
    for row in loss.rows:
        cell, subset = loss.cells[row, f"{size}/val_loss"], runs[runs["row"] == row]
        n = _first(subset, "N")
        if cell.mean is None or n is None:
            continue
        losses += [(row, n, value) for value in cell.seeds.values()]
        if row not in bases or cell.versus is None:
            continue
        base = runs[runs["row"] == bases[row]]
        params, base_params = _first(subset, "params.model.params"), _first(base, "params.model.params")
        steps, batch = _first(subset, "params.train.steps"), _first(subset, "params.train.batch_tokens")
        points.append(Point(row, size, int(n), cell.versus, params / base_params if params and base_params else None,
                            training_flops(int(params), 1) if params else None,
                            int(steps * batch) if steps and batch else None))
        reference = loss.cells[bases[row], f"{size}/val_loss"].seeds
        ratios += [(row, _first(base, "N"), math.log(value / reference[seed]))
                   for seed, value in cell.seeds.items() if seed in reference]


def _line(x: list[float], y: list[float]) -> tuple[float, float, float | None, float, float]:
    """Least squares y = intercept + slope x: (intercept, slope, residual std (None without spare
    points), mean of x, sum of squares of x about it)."""
    n, mean_x, mean_y = len(x), sum(x) / len(x), sum(y) / len(y)
    sxx = sum((xi - mean_x) ** 2 for xi in x)
    slope = sum((xi - mean_x) * (yi - mean_y) for xi, yi in zip(x, y, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    if n < 3:
        return intercept, slope, None, mean_x, sxx
    residual = sum((yi - intercept - slope * xi) ** 2 for xi, yi in zip(x, y, strict=True))
    return intercept, slope, math.sqrt(residual / (n - 2)), mean_x, sxx


def fit_power_law(row: str, points: list[tuple[float, float]]) -> Fit | None:
    """loss(N) over (N, loss) points (each seed one); None with fewer than two sizes."""
    sizes = len({n for n, _ in points})
    if sizes < 2 or any(v <= 0 for _, v in points):
        return None
    x, y = [math.log(n) for n, _ in points], [math.log(v) for _, v in points]
    intercept, slope, s, _, sxx = _line(x, y)
    pure = Fit(row, PURE, math.exp(intercept), -slope, 0.0,
               None if not s else _around(-slope, t_quantile(len(x) - 1) * s / math.sqrt(sxx)), len(points), sizes)
    return _saturating(pure, points) if sizes >= 4 else pure


def _around(value: float, half: float) -> tuple[float, float]:
    return value - half, value + half


def _saturating(pure: Fit, points: list[tuple[float, float]]) -> Fit:
    """loss = a N^-alpha + c (0 <= c < the lowest loss), started from the pure fit; the pure fit where
    scipy's does not converge or gives no covariance."""
    import numpy as np
    from scipy.optimize import curve_fit

    n_ref = math.exp(sum(math.log(n) for n, _ in points) / len(points))   # N in units of its geometric mean
    x, y = np.array([n / n_ref for n, _ in points]), np.array([v for _, v in points])
    start = (pure.a * n_ref ** -pure.alpha, pure.alpha, 0.0)
    try:
        (a, alpha, c), cov = curve_fit(lambda n, a, alpha, c: a * n ** -alpha + c, x, y, p0=start,
                                       bounds=([0.0, 0.0, 0.0], [np.inf, 10.0, float(y.min())]))
    except (RuntimeError, ValueError):
        return pure
    if not np.isfinite(cov).all():
        return pure
    spare = len(points) - 3
    interval = _around(alpha, t_quantile(spare + 1) * math.sqrt(cov[1, 1])) if spare > 0 else None
    return Fit(pure.row, SATURATING, a * n_ref ** alpha, alpha, c, interval, pure.points, pure.sizes)


def extrapolate_gap(row: str, size: str, ratios: list[tuple[float, float]]) -> Gap | None:
    """The fitted relative gap (%) at the paper's `size` from (the baseline's N, log ratio) per seed;
    None with fewer than two sizes, or for the baseline."""
    if row.partition(" ")[0] == BASELINE or len({n for n, _ in ratios}) < 2:
        return None
    x, y = [math.log(n) for n, _ in ratios], [r for _, r in ratios]
    intercept, slope, s, mean_x, sxx = _line(x, y)
    x0 = math.log(PAPER_N[size])
    fitted = intercept + slope * x0
    interval = None
    if s:
        half = t_quantile(len(x) - 1, CONFIDENCE) * s * math.sqrt(1 / len(x) + (x0 - mean_x) ** 2 / sxx)
        interval = (100.0 * math.expm1(fitted - half), 100.0 * math.expm1(fitted + half))
    return Gap(row, size, 100.0 * math.expm1(fitted), interval, len(x), slope, intercept, not min(x) <= x0 <= max(x))


def _pct(value: float | None, interval: tuple[float, float] | None = None) -> str:
    if value is None:
        return ""
    return f"{value:+.2f}%" + (f" [{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else "")


def _millions(n: float) -> str:
    return f"{n / 1e6:.3g}M"


def sections(view: CrossSize) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, headers, rows, note) of the three tables across sizes, for every rendering."""
    from .tables import row_label
    ours = [p for p in view.points if p.difference is not None]
    gap_rows = []
    for p in view.points:
        measured = p.difference is not None
        gap_rows.append([row_label(p.row), p.size if measured else f"{p.size} (paper)", _millions(p.n),
                         str(p.difference.n) if measured else "", _pct(p.relative, p.interval),
                         p.difference.verdict(False) if measured else "",
                         _pct(100 * (p.params_ratio - 1)) if p.params_ratio else "",
                         f"{p.flops_per_token / 1e6:.3g}M" if p.flops_per_token else "",
                         f"{p.tokens:.3g}" if p.tokens else ""])
    fit_rows = [[row_label(f.row), f.form, f"{f.a:.4g}", f"{f.alpha:.4f}" + (
        f" [{f.alpha_interval[0]:.4f}, {f.alpha_interval[1]:.4f}]" if f.alpha_interval else ""),
        f"{f.c:.4g}" if f.form == SATURATING else "", str(f.sizes), str(f.points)] for f in view.fits]
    paper = {(p.row, p.size): p.relative for p in view.points if p.difference is None}
    extrapolated = [[row_label(g.row), f"{g.size} ({_millions(PAPER_N[g.size])})", _pct(g.relative, g.interval),
                     "EXTRAPOLATED" if g.extrapolated else "within ours", _pct(paper.get((g.row, g.size))),
                     str(g.points)] for g in view.gaps]
    sizes = ", ".join(view.sizes)
    return [
        (f"Across sizes ({sizes}): final validation loss against the baseline, paired by seed",
         ["Model", "size", "N", "seeds", f"Δ % vs baseline [{CONFIDENCE:.0%} CI]", "verdict",
          "params vs baseline", "6N FLOPs/token", "tokens"], gap_rows,
         ("N: non-embedding parameters. Δ %: the mean paired difference over the baseline's mean loss, its interval "
          "the paired t interval's (none with one seed). Params and 6N FLOPs per token: the row's, against the "
          f"baseline's of its size (the Delta state's own ops are not in 6N; `make bench` times them). {len(ours)} "
          f"points of ours; the paper's (its Table 3, one run each) marked (paper). {view.note}").rstrip()),
        (f"Power law per row: final validation loss ({view.unit}) against N",
         ["Model", "form", "a", f"alpha [{CONFIDENCE:.0%} CI]", "c", "sizes", "points"], fit_rows,
         f"Least squares over every seed's loss. {SATURATING} where four sizes or more support three parameters "
         f"(and the fit converges), else {PURE} (a line in log-log). No interval without points to spare."),
        ("The fitted gap to the baseline at the paper's sizes (EXTRAPOLATED where beyond ours)",
         ["Model", "at N of", f"fitted Δ % [{CONFIDENCE:.0%} CI]", "reading", "paper's Δ %", "points"], extrapolated,
         f"log(L_row / L_baseline) per seed, linear in log N (two pure power laws' difference), read at the paper's "
         f"N. EXTRAPOLATED: beyond the measured sizes ({sizes}); its interval is the fitted mean's and holds only "
         "if that line holds out there."),
    ]
