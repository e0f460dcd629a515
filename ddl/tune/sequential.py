"""Seeds added until a gap resolves, without the false positives that stopping on a significant result
brings: an alpha-spending group-sequential rule.

The confirmation looks at a row's paired differences to the tuned baseline after n_1 < n_2 < ... <= N
seeds (`TuneConfig.seed_plan`). Look k tests at level alpha_k = a(t_k) - a(t_{k-1}), t_k = n_k / N, with
Lan and DeMets' O'Brien-Fleming-type spending function a(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)), which
spends almost nothing at the first looks (few seeds: wide t intervals) and most at the last. Each look's
interval is the paired t interval at confidence 1 - alpha_k, exact for normal seed noise whatever the
variance, so the chance that any look declares a difference that is not there is at most the sum of the
alpha_k (Bonferroni), a(1) = alpha. This gives up a little power against the exact group-sequential
boundaries (which need the looks' joint distribution) for a guarantee that holds with the variance
estimated at each look. A single look (a fixed number of seeds) is the plain 95% interval.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

from ..stats import Difference, paired


def spent(t: float, alpha: float) -> float:
    """O'Brien-Fleming-type alpha spent by information fraction t (Lan and DeMets 1983)."""
    from scipy.stats import norm
    return float(2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(t)))


@functools.lru_cache(maxsize=None)
def look_levels(plan: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """alpha_k of each look of the plan (its last count is the maximum); they add up to alpha."""
    total = plan[-1]
    spending = [spent(n / total, alpha) for n in plan]
    return tuple(b - a for a, b in zip([0.0, *spending[:-1]], spending, strict=True))


@dataclass(frozen=True)
class Look:
    n: int                         # seeds paired so far
    level: float                   # alpha_k of this look
    difference: Difference | None
    final: bool                    # the last look of the plan

    @property
    def resolved(self) -> bool:
        return self.difference is not None and self.difference.resolved

    @property
    def done(self) -> bool:
        return self.resolved or self.final


def look(arm: dict, reference: dict, plan: tuple[int, ...], alpha: float) -> Look:
    """The rule at the look the paired seeds have reached (the largest planned count they cover)."""
    n = len(set(arm) & set(reference))
    reached = [k for k, planned in enumerate(plan) if planned <= n]
    if not reached:
        return Look(n, 0.0, None, False)
    k = reached[-1]
    level = look_levels(plan, alpha)[k]
    return Look(n, level, paired(arm, reference, confidence=1 - level), k == len(plan) - 1)


def simulate(experiments: int, gap_sd: float, plan: tuple[int, ...], alpha: float, seed: int = 0,
             seed_sd: float = 0.01) -> tuple[float, float]:
    """(the fraction of experiments the rule resolves, the fraction resolved before the last look) over
    synthetic experiments: two rows whose per-seed losses carry independent normal seed noise of
    `seed_sd` and whose true means differ by `gap_sd` standard deviations of the paired difference."""
    rng = random.Random(seed)
    sd_diff = seed_sd * math.sqrt(2)
    resolved = early = 0
    for _ in range(experiments):
        base, arm = {}, {}
        for n in plan:
            for s in range(len(base), n):
                base[s] = 2.0 + rng.gauss(0, seed_sd)
                arm[s] = 2.0 + gap_sd * sd_diff + rng.gauss(0, seed_sd)
            result = look(arm, base, plan, alpha)
            if result.resolved:
                resolved += 1
                early += not result.final
            if result.done:
                break
    return resolved / experiments, early / experiments
