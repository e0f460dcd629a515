"""Seeds added until a gap resolves, without the false positives that stopping on a significant result
brings: an alpha-spending group-sequential rule, over search replicates.

The confirmation looks at a row's differences to the tuned baseline, one per search replicate (the replicate's
mean over its fresh confirmation seeds at its own best, less the baseline's replicate over the same seeds),
after n_1 < n_2 < ... <= N seeds a replicate (`TuneConfig.seed_plan`). Look k tests at level
alpha_k = a(t_k) - a(t_{k-1}), t_k = n_k / N, with Lan and DeMets' O'Brien-Fleming-type spending function
a(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)), which spends almost nothing at the first looks and most at the last.
Each look's interval is the paired t interval over the replicates at confidence 1 - alpha_k, exact for normal
replicate values whatever their variance, so the chance that any look declares a difference that is not there is
at most the sum of the alpha_k (Bonferroni), a(1) = alpha. A single look (a fixed number of seeds) is the plain
95% interval. The interval has replicates - 1 degrees of freedom whatever the seeds: seeds narrow the noise
within a replicate, not the search's luck between replicates, which the spread of the replicates carries.

A confirmation run that diverged or failed is never dropped (that would favour an unstable row): its loss is
FAILED, its replicate's mean with it, and that replicate leaves the interval while the failure blocks a verdict in
the failing row's favour (ddl.tune.workflow.verdict). The driver, the simulator and the report all take a look here:
the report's interval is the one that decided.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

from ..stats import Difference, paired

FAILED = math.inf             # the loss of a confirmation run that diverged or failed


def spent(t: float, alpha: float) -> float:
    """O'Brien-Fleming-type alpha spent by information fraction t (Lan and DeMets 1983)."""
    normal = NormalDist()
    return 2 - 2 * normal.cdf(normal.inv_cdf(1 - alpha / 2) / math.sqrt(t))


@functools.lru_cache(maxsize=None)
def look_levels(plan: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """alpha_k of each look of the plan (its last count is the maximum); they add up to alpha."""
    total = plan[-1]
    spending = [spent(n / total, alpha) for n in plan]
    return tuple(b - a for a, b in zip([0.0, *spending[:-1]], spending, strict=True))


@dataclass(frozen=True)
class Look:
    n: int                         # confirmation seeds per replicate so far
    level: float                   # alpha_k of this look
    difference: Difference | None  # over the replicates: each one's mean over its first n seeds (failures left out)
    final: bool                    # the last look of the plan
    arm_failed: str = ""           # the row's confirmation runs that diverged or failed: no "better" for it
    reference_failed: str = ""     # the baseline's: no "worse" for the row

    @property
    def resolved(self) -> bool:
        return self.difference is not None and self.difference.resolved

    @property
    def done(self) -> bool:
        return self.resolved or self.final


def seeds_reached(arm: dict, reference: dict) -> int:
    """The confirmation seeds every replicate of both rows has, paired (arm, reference: replicate -> {seed:
    loss}); 0 when they share no replicate."""
    shared = set(arm) & set(reference)
    return min((len(set(arm[r]) & set(reference[r])) for r in shared), default=0)


def replicate_means(rows: dict, n: int, paired_with: dict | None = None) -> dict:
    """Each replicate's mean loss over its first n confirmation seeds (those it shares with `paired_with`)."""
    means = {}
    for r, seeds in rows.items():
        shared = sorted(set(seeds) & set(paired_with.get(r, {}))) if paired_with is not None else sorted(seeds)
        if len(shared) >= n:
            means[r] = sum(seeds[s] for s in shared[:n]) / n
    return means


def look(arm: dict, reference: dict, plan: tuple[int, ...], alpha: float) -> Look:
    """The rule at the look the replicates' seeds have reached (the largest planned count every one covers):
    the paired t interval over the replicates (arm, reference: replicate -> {seed: loss}), each replicate one
    value, its mean over those seeds. A replicate's value carries its search's luck (where its best landed)
    and its seeds' noise, so the spread between replicates is the whole workflow's."""
    n = seeds_reached(arm, reference)
    reached = [k for k, planned in enumerate(plan) if planned <= n]
    if not reached:
        return Look(n, 0.0, None, False)
    k = reached[-1]
    return at_look(arm, reference, plan[k], look_levels(plan, alpha)[k], k == len(plan) - 1)


def at_look(arm: dict, reference: dict, n: int, level: float, final: bool = True) -> Look:
    """The look at n seeds a replicate, at level alpha_k: each replicate's mean over its first n seeds it shares
    with the other row, paired by replicate; a replicate with a failed run leaves the interval and is named."""
    if n < 1:
        return Look(n, level, None, final)
    means = replicate_means(arm, n, reference), replicate_means(reference, n, arm)
    finite = [{r: m for r, m in side.items() if math.isfinite(m)} for side in means]
    return Look(n, level, paired(*finite, confidence=1 - level), final, _failures(arm, means[0], n, "the row"),
                _failures(reference, means[1], n, "the baseline"))


def _failures(rows: dict, means: dict, n: int, whose: str) -> str:
    failed = [f"replicate {r} seed {seed}" for r in sorted(means) if not math.isfinite(means[r])
              for seed in sorted(rows[r]) if not math.isfinite(rows[r][seed])]
    return f"{whose}'s confirmation diverged or failed: {', '.join(failed)}" if failed else ""
