"""Seed statistics: paired differences over seeds, their t intervals and verdicts (the report's tables, the
search's confirmation).

Pure functions over {seed: value} mappings. Two arms trained from the same seed see the same
batches in the same order (the loader's seed), so what the data order adds to a loss cancels in
their difference: the interval is a t interval over the per-seed differences (Student's t,
n - 1 degrees of freedom, quantiles from scipy, a dependency of mlflow's as well). Differences
without spread (a discrete score, say 77 items, that moved by the same items for every seed) give
no interval: a zero-width t interval would claim a certainty the items do not have.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Mapping

CONFIDENCE = 0.95
BETTER, WORSE, NOT_RESOLVED = "better", "worse", "not resolved"
MAX_SEEDS = 1000   # seeds_to_resolve gives up beyond this
POWER = 0.8        # the chance a planned comparison resolves a true gap of its detectable size
SAME = 1e-9        # differences within this relative spread are one value (float rounding)


@functools.lru_cache(maxsize=None)
def t_quantile(n: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided t quantile for a mean over n values (n - 1 degrees of freedom)."""
    from scipy.special import stdtrit           # scipy.stats' t.ppf, without importing scipy.stats (~0.7 s)
    return float(stdtrit(n - 1, 0.5 + confidence / 2))


@dataclass(frozen=True)
class Difference:
    """arm - reference, paired by seed. low/high: the interval of the mean, None under two seeds
    or without spread."""
    n: int
    mean: float
    std: float | None
    low: float | None
    high: float | None
    reference: float              # the reference's mean over the paired seeds
    correlation: float | None = None   # of the arm's and the reference's values across the seeds (3 or more)

    @property
    def relative(self) -> float | None:
        """The difference in percent of the reference's mean."""
        return None if self.reference == 0 else 100.0 * self.mean / abs(self.reference)

    @property
    def resolved(self) -> bool:
        return self.low is not None and (self.low > 0 or self.high < 0)

    def verdict(self, higher_is_better: bool) -> str:
        if not self.resolved:
            return NOT_RESOLVED
        return BETTER if (self.mean > 0) == higher_is_better else WORSE


def paired(arm: Mapping, reference: Mapping, confidence: float = CONFIDENCE) -> Difference | None:
    """The per-seed differences over the seeds both have; None when they share none."""
    seeds = sorted(set(arm) & set(reference))
    if not seeds:
        return None
    diffs = [arm[s] - reference[s] for s in seeds]
    n, mean = len(diffs), sum(diffs) / len(diffs)
    reference_mean = sum(reference[s] for s in seeds) / n
    if n < 2:
        return Difference(n, mean, None, None, None, reference_mean)
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if std <= SAME * max(1.0, *map(abs, diffs)):   # equal up to rounding: no spread
        return Difference(n, mean, 0.0, None, None, reference_mean)
    half = t_quantile(n, confidence) * std / math.sqrt(n)
    return Difference(n, mean, std, mean - half, mean + half, reference_mean,
                      correlation([arm[s] for s in seeds], [reference[s] for s in seeds]))


def correlation(x: list[float], y: list[float]) -> float | None:
    """Pearson's r of two series; None under three points or where one has no spread."""
    n = len(x)
    if n < 3:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    if not sxx or not syy:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / math.sqrt(sxx * syy)


def seeds_to_resolve(std: float, effect: float, confidence: float = CONFIDENCE) -> int | None:
    """The fewest seeds whose interval half-width t * std / sqrt(n) is below |effect|, for
    differences with this per-seed std; None without spread or effect, or beyond MAX_SEEDS."""
    if effect == 0 or std == 0:
        return None
    for n in range(2, MAX_SEEDS + 1):
        if t_quantile(n, confidence) * std / math.sqrt(n) < abs(effect):
            return n
    return None


def power_of(shift: float, n: int, alpha: float = 1 - CONFIDENCE) -> float:
    """The chance a two-sided paired t test over n units at level alpha resolves a true mean difference of `shift`
    sds of a unit's difference (the noncentral t's tails, scipy.special's nctdtr)."""
    from scipy.special import nctdtr
    q, nc = t_quantile(n, 1 - alpha), shift * math.sqrt(n)
    wrong_side = float(nctdtr(n - 1, nc, -q))          # below 1e-16 for a large shift, where scipy may give nan
    return float(1 - nctdtr(n - 1, nc, q)) + (0.0 if math.isnan(wrong_side) else wrong_side)


def detectable(std: float, n: int, alpha: float = 1 - CONFIDENCE, power: float = POWER) -> float | None:
    """The smallest true mean difference a two-sided paired t test over n units, each difference of sd `std`,
    resolves at level alpha with chance `power` (exact, from the noncentral t, by bisection from the normal
    approximation's (t_{1-alpha/2} + t_power) std / sqrt(n)). None under two units."""
    if n < 2:
        return None
    low, high = 0.0, 2 * (t_quantile(n, 1 - alpha) + t_quantile(n, 2 * power - 1)) / math.sqrt(n)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if power_of(mid, n, alpha) < power else (low, mid)
    return high * std


def units_to_detect(std: float, gap: float, alpha: float = 1 - CONFIDENCE, limit: int = MAX_SEEDS) -> int | None:
    """The fewest units whose detectable difference (above) is at most |gap|; None beyond `limit`."""
    return next((n for n in range(2, limit + 1) if detectable(std, n, alpha) <= abs(gap)), None)


@dataclass(frozen=True)
class Estimate:
    """A mean with its t interval (None under two values)."""
    n: int
    mean: float
    low: float | None
    high: float | None


def mean_interval(values, confidence: float = CONFIDENCE) -> Estimate | None:
    """The mean of the values with its t interval; None for no values."""
    values = list(values)
    if not values:
        return None
    n, mean = len(values), sum(values) / len(values)
    if n < 2:
        return Estimate(n, mean, None, None)
    half = t_quantile(n, confidence) * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)
    return Estimate(n, mean, mean - half, mean + half)


@dataclass(frozen=True)
class Slope:
    """The least-squares slope of y on x over n points, with its t interval (None under three points)."""
    n: int
    value: float
    low: float | None
    high: float | None


def slope(x: list[float], y: list[float], confidence: float = CONFIDENCE) -> Slope:
    """y = a + b x by least squares: b, and its interval from Student's t with n - 2 degrees of freedom."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    b = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y, strict=True)) / sxx
    if n < 3:
        return Slope(n, b, None, None)
    residual = sum((yi - my - b * (xi - mx)) ** 2 for xi, yi in zip(x, y, strict=True))
    half = t_quantile(n - 1, confidence) * math.sqrt(residual / (n - 2) / sxx)
    return Slope(n, b, b - half, b + half)
