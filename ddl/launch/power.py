"""What a plan can resolve, before it runs: per compared row, the smallest gap to its baseline that the row's paired
interval resolves with 80% power at its alpha (ddl.stats.detectable), and with `detect=<share>` the seeds (a searched
row: the replicates and seeds) each row needs for a gap of that share of the baseline's loss.

The spread is a row's loss less its baseline's at one seed. It comes from `seed_sd=<nats>` where given (rows taken as
independent at a seed: the difference's sd is seed_sd sqrt 2), else from the store's finished runs of the same size,
data and schedule: the sd of paired differences between rows that share seeds, or where no two rows do, the pooled sd
over seeds within rows, times sqrt 2. The baseline's loss, which makes a gap a share, is the store's there, or the
paper's (its sizes on its data). Where neither gives a spread, the plan says so and names the pilot that would.
A searched row's unit is a replicate (its mean over its seeds), whose difference to the baseline's carries the
seeds' noise and the two searches' luck (where each landed): LUCK models the latter from the simulator.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from ..stats import CONFIDENCE, POWER, detectable, units_to_detect
from .configs import ConfigError
from .spec import Job, row_name, size_name

MAX_REPLICATES = 100            # detect's search for a searched row's design stops here
# The search's luck in a replicate's difference, as a share of one seed's paired variance: `python -m
# ddl.tune.simulate` at the tuned study's curvature (0.08 nats/decade^2) measured a 3 x 3 design's detectable gap
# 1.29x its seeds' noise alone, 1.29^2 = 1 + LUCK / (1/3); 0.14 at curvature 0.04, 0.30 at 0.16 (docs/results.md).
LUCK = 0.22
PILOT_SEEDS = 3


@dataclass(frozen=True)
class Spread:
    sd: float                    # a row's loss less its baseline's at one seed: its sd, nats
    source: str                  # where it was read
    loss: float | None = None    # the baseline's loss in the setting (a gap's share is of it)


@dataclass(frozen=True)
class Design:
    """What a compared row runs against its baseline: `units` paired units of `seeds` seeds each at level alpha."""
    units: int
    seeds: int = 1
    alpha: float = 0.05
    searched: bool = False

    def gap(self, spread: Spread) -> float | None:
        """The smallest true gap (nats) resolved with 80% power; None with fewer than two units."""
        variance = spread.sd ** 2 * (1 / self.seeds + (LUCK if self.searched else 0))
        return detectable(math.sqrt(variance), self.units, self.alpha)

    def text(self) -> str:
        if self.searched:
            return f"{self.units} replicates x {self.seeds} seeds"
        return f"{self.units} seed{'s' * (self.units != 1)} paired"


def goal(jobs: list[Job]) -> tuple[float | None, float | None]:
    """The sweep's (detect, seed_sd): one value each for the whole sweep."""
    found = {(job.detect, job.seed_sd) for job in jobs}
    if len(found) > 1:
        raise ConfigError("detect, seed_sd: one value for the whole sweep; a list of them is not a sweep axis")
    return found.pop()


def setting(job: Job) -> dict[str, str]:
    """The params that fix a seed's spread: the size, the data and the schedule."""
    run = job.run
    return {"model.size": size_name(run.model), "data.source": run.data.source, "data.tokenizer": run.data.tokenizer,
            "train.steps": str(run.train.steps), "train.batch_tokens": str(run.train.batch_tokens)}


def setting_text(job: Job) -> str:
    run = job.run
    return f"{size_name(run.model)} on {run.data.source}/{run.data.tokenizer}, {run.train.steps} steps"


def spread(job: Job, seed_sd: float | None) -> Spread | None:
    """The spread for a comparison at the job's size, data and schedule (module doc); None where nothing tells."""
    runs = _stored(job)
    loss = _baseline_loss(job, runs)
    if seed_sd is not None:
        return Spread(seed_sd * math.sqrt(2), f"seed_sd={seed_sd:g} (rows independent at a seed)", loss)
    if runs is None or runs.empty:
        return None
    groups = _seed_groups(runs)
    paired = _paired_sd(groups)
    if paired is not None:
        sd, n = paired
        return Spread(sd, f"the store: {n} paired differences between rows at {setting_text(job)} "
                          f"({len(runs)} runs of {', '.join(sorted(set(runs['experiment_name'])))})", loss)
    pooled = _pooled_sd([seeds for _, seeds in groups])
    if pooled is None:
        return None
    sd, n = pooled
    return Spread(sd * math.sqrt(2), f"the store: seed sd {sd:.3g} over {n} runs of a row at {setting_text(job)} "
                                     f"x sqrt 2 (rows independent at a seed)", loss)


def _stored(job: Job):
    """The store's finished runs in the job's setting, each with its experiment's name; None without a store."""
    from ..track import store
    if not store.exists():                    # before importing the query's MLflow and pandas: a dry run stays fast
        return None
    from ..track import query
    runs = query.finished_like(setting(job))
    if runs.empty or "metrics.final/val/loss" not in runs:
        return runs.iloc[:0]
    names = store.experiment_names()
    return runs[runs["metrics.final/val/loss"].notna()].assign(experiment_name=runs["experiment_id"].map(names))


def _seed_groups(runs) -> list[tuple[tuple, dict]]:
    """(a row's params but its seed, {seed: final loss}) per row of the runs."""
    keys = sorted(c for c in runs.columns if c.startswith("params.") and c != "params.seed")
    groups = []
    for setting_values, group in runs.groupby([runs[k].fillna("").astype(str) for k in keys], sort=False,
                                              dropna=False):
        named = dict(zip(keys, setting_values if isinstance(setting_values, tuple) else (setting_values,),
                         strict=True))
        seeds = {int(s): float(v) for s, v in zip(group["params.seed"], group["metrics.final/val/loss"], strict=True)}
        groups.append((named, seeds))
    return groups


def _pooled_sd(samples: list) -> tuple[float, int] | None:
    """The pooled sd of values over samples ({key: value} each) with two or more, and the values counted."""
    used = [list(s.values()) for s in samples if len(s) >= 2]
    df = sum(len(v) - 1 for v in used)
    if not df:
        return None
    ss = sum(sum((x - sum(v) / len(v)) ** 2 for x in v) for v in used)
    return math.sqrt(ss / df), sum(map(len, used))


def _paired_sd(groups) -> tuple[float, int] | None:
    """The pooled sd of row-less-baseline differences at shared seeds, over rows of one data and schedule."""
    def schedule(named: dict) -> tuple:
        return tuple(v for k, v in sorted(named.items()) if not k.startswith("params.model."))
    baselines = [(n, s) for n, s in groups if n.get("params.model.residual") == "baseline"]
    diffs = []
    for named, seeds in groups:
        for base_named, base in baselines:
            if base is not seeds and schedule(base_named) == schedule(named):
                diffs.append({s: seeds[s] - base[s] for s in set(seeds) & set(base)})
    return _pooled_sd(diffs)


def _baseline_loss(job: Job, runs) -> float | None:
    """The baseline's final loss in the setting: the store's mean, else the paper's (Table 3, its data)."""
    if runs is not None and not runs.empty and "params.model.residual" in runs:
        own = runs[runs["params.model.residual"] == "baseline"]
        if not own.empty:
            return float(own["metrics.final/val/loss"].mean())
    paper = paper_losses(job)
    return paper.get("baseline")


def paper_losses(job: Job) -> dict[str, float]:
    """{row: the paper's validation loss} at the job's size, where the job trains on the paper's data."""
    from ..paper import val_losses
    data, size = job.run.data, size_name(job.run.model)
    if (data.source, data.tokenizer) != ("fineweb_edu", "gpt2"):
        return {}
    return {row: loss for (at, row), loss in val_losses().items() if at == size}


def paper_gap(job: Job) -> str:
    """The paper's gap for the job's row at the nearest of its sizes: `the paper's gap at small: -0.66%`."""
    from ..paper import val_losses
    losses, row = val_losses(), row_name(job.run.model)
    for size in dict.fromkeys([size_name(job.run.model), "small"]):
        if (size, row) in losses and (size, "baseline") in losses:
            base = losses[size, "baseline"]
            return f"the paper's gap at {size}: {100 * (losses[size, row] - base) / base:+.2f}%"
    return ""


def row_label(job: Job) -> str:
    """A row's name without its seed: `ddl_dv4-small`, `ddl_dv1-tiny beta_init=0.5`."""
    return job.name.replace(f"-s{job.run.seed}", "", 1)


def gap_text(gap: float | None, spread: Spread) -> str:
    if gap is None:
        return "no paired interval: resolves no gap"
    share = f" ({100 * gap / spread.loss:.2f}% of the baseline's {spread.loss:.4g})" if spread.loss else ""
    return f"resolves |gap| >= {gap:.3g} nats{share}"


def statement(rows: list[tuple[Job, Design]], spread: Spread | None, pilot: str) -> list[str]:
    """The plan's lines: what each compared row resolves with 80% power at its alpha."""
    head = f"ddl-run: what this plan can resolve ({POWER:.0%} power, each row paired with its baseline)"
    if spread is None:
        single = [f"  {row_label(job)}: {design.text()}: no paired interval, resolves no gap"
                  for job, design in rows if design.units < 2]
        return [f"{head}: unknown: the store holds no two seeds of a row there and no seed_sd= was given; {pilot}",
                *single]
    lines = [f"{head}; seed spread from {spread.source}:"]
    for job, design in rows:
        floor = " with the search's luck as simulated" if design.searched and design.units >= 2 else ""
        paper = paper_gap(job)
        lines.append(f"  {row_label(job)}: {design.text()}: "
                     f"{gap_text(design.gap(spread), spread)}{floor}{f'; {paper}' if paper else ''}")
    return lines


def pilot_text(job: Job, gpus: int) -> str:
    """The pilot that would measure the spread: PILOT_SEEDS baseline seeds in the job's setting, with their cost."""
    from .estimate import job_cost
    model = dataclasses.replace(job.run.model, residual="baseline")
    cost = job_cost(dataclasses.replace(job, run=dataclasses.replace(job.run, model=model)), gpus)
    price = f"{PILOT_SEEDS * cost.gpu_hours:.3g} GPU-h" if cost.cpu_seconds is None else \
        f"{PILOT_SEEDS * cost.cpu_seconds / 60:.3g} core-min"
    return (f"a pilot that tells: {PILOT_SEEDS} baseline seeds at {setting_text(job)} (+variant=baseline "
            f"seed=0,1,2), {price}")


def seeds_needed(spread: Spread | None, detect: float, alpha: float, limit: int, pilot: str) -> int:
    """The seeds (units) a comparison needs to resolve a gap of `detect` of the baseline's loss; one ConfigError
    line, naming what would do, where nothing tells or `limit` (tune.max_seeds) is too few."""
    target = _target(spread, detect, "a row's seeds", pilot)
    n = units_to_detect(spread.sd, target, alpha, limit)
    if n is None:
        wanted = units_to_detect(spread.sd, target, alpha)
        floor = detectable(spread.sd, limit, alpha) / spread.loss
        raise ConfigError(f"detect={detect:g}: a gap of {target:.3g} nats needs {wanted or '> 1000'} seeds a row at "
                          f"a paired sd of {spread.sd:.3g} nats, over tune.max_seeds={limit}: set tune.max_seeds="
                          f"{wanted or 1000}, or detect >= {floor:.2g}")
    return n


def design_needed(spread: Spread | None, detect: float, alpha: float, limit: int, trials: int,
                  pilot: str) -> Design:
    """A searched row's cheapest (replicates, seeds), seeds at most `limit`, that resolves `detect`: each replicate
    costs its `trials` and its seeds."""
    target = _target(spread, detect, "a searched row", pilot)
    fits = [fit for s in range(1, limit + 1)          # at each seed count, the fewest replicates that reach it
            if (fit := next((d for r in range(2, MAX_REPLICATES + 1)
                             if (d := Design(r, s, alpha, True)).gap(spread) <= target), None))]
    if not fits:
        floor = Design(MAX_REPLICATES, limit, alpha, True).gap(spread) / spread.loss
        raise ConfigError(f"detect={detect:g}: a gap of {target:.3g} nats needs over {MAX_REPLICATES} replicates of "
                          f"tune.max_seeds={limit} seeds a row; raise tune.max_seeds, or detect >= {floor:.2g}")
    return min(fits, key=lambda d: (d.units * (trials + d.seeds), d.units))


def _target(spread: Spread | None, detect: float, what: str, pilot: str) -> float:
    if spread is None or spread.loss is None:
        missing = "a seed spread (seed_sd=<nats>, or seeds of a row in the store)" if spread is None else \
            "the baseline's loss (a finished baseline in the store, or the paper's size on its data)"
        raise ConfigError(f"detect={detect:g}: sizing {what} needs {missing}; {pilot}")
    return detect * spread.loss


def _row_key(job: Job) -> str:
    return dataclasses.replace(job.run, seed=0).signature()


def _baseline_key(job: Job, keys: dict[str, Job]) -> str | None:
    """The key of the row's baseline among the sweep's rows: the baseline of its backbone, data, schedule and
    replica."""
    run = job.run
    if run.model.residual == "baseline":
        return None
    backbone = dataclasses.replace(run.model, residual="baseline").effective()
    for key, other in keys.items():
        base = other.run
        if (base.model.residual == "baseline" and base.model.effective() == backbone and base.replica == run.replica
                and base.data == run.data and base.train == run.train):
            return key
    return None


def _rows(jobs: list[Job]) -> tuple[dict[str, list[Job]], dict[str, str]]:
    """({row key: its jobs}, {compared row key: its baseline's key}). Jobs whose overrides differ only in their seed
    are one row at once; the key (a signature, ~0.3 ms) is computed once a group, not once a job."""
    groups: dict[tuple, list[Job]] = {}
    for job in jobs:
        groups.setdefault(tuple(_without_seed(job.overrides)), []).append(job)
    rows: dict[str, list[Job]] = {}
    for group in groups.values():
        rows.setdefault(_row_key(group[0]), []).extend(group)
    firsts = {key: group[0] for key, group in rows.items()}
    pairs = {key: base for key, job in firsts.items() if (base := _baseline_key(job, firsts))}
    return rows, pairs


def _without_seed(overrides: list[str]) -> list[str]:
    return [o for o in overrides if o.lstrip("+").split("=", 1)[0] != "seed"]


def _with_seeds(job: Job, seeds) -> list[list[str]]:
    return [[*_without_seed(job.overrides), f"seed={seed}"] for seed in seeds]


def plan_seeds(launcher, plan, gpus: int):
    """(the plan, sized by `detect=` where given, and the lines saying what it can resolve) of a sweep of plain
    seeds; one ConfigError line for a goal it cannot meet or a sweep with nothing to compare."""
    detect, seed_sd = goal(plan.jobs)
    rows, pairs = _rows(plan.jobs)
    if not pairs:
        if detect is not None:
            refuse_without_comparison(detect, [group[0].name for group in rows.values()])
        return plan, []
    spreads = {key: spread(rows[key][0], seed_sd) for key in dict.fromkeys(pairs.values())}
    sized = []
    if detect is not None:
        alpha, limit = 1 - CONFIDENCE, plan.jobs[0].tuning.max_seeds
        needed = {key: seeds_needed(spreads[base], detect, alpha, limit, pilot_text(rows[base][0], gpus))
                  for key, base in pairs.items()}
        wanted = {key: max(needed.get(key, 0), *(needed[k] for k, b in pairs.items() if b == key), 0)
                  for key in rows}
        overrides = [o for key, group in rows.items()
                     for o in _with_seeds(group[0], _seed_range(group, wanted[key]))]
        plan = launcher.plan(overrides)
        rows, pairs = _rows(plan.jobs)
        sized = [f"ddl-run: detect={detect:g} sizes each compared row at {max(needed.values())} seeds "
                 f"(tune.max_seeds={limit})"]
    compared = {}
    for key, base in pairs.items():
        shared = {j.run.seed for j in rows[key]} & {j.run.seed for j in rows[base]}
        compared.setdefault(base, []).append((rows[key][0], Design(len(shared))))
    return plan, sized + list(dict.fromkeys(line for base, designs in compared.items()
                                            for line in statement(designs, spreads[base], pilot_text(rows[base][0],
                                                                                                     gpus))))


def _seed_range(group: list[Job], n: int) -> list[int]:
    """The row's seeds, and fresh ones after its first until it has n."""
    seeds = [job.run.seed for job in group]
    fresh = (s for s in itertools.count(seeds[0]) if s not in seeds)
    return seeds + list(itertools.islice(fresh, max(0, n - len(seeds))))


def refuse_without_comparison(detect: float, rows: list[str]) -> None:
    """detect= on a sweep that compares no row with a baseline: one ConfigError line naming its rows."""
    raise ConfigError(f"detect={detect:g}: the sweep has no row beside a baseline of its size, data and schedule to "
                      f"compare ({', '.join(rows)}); detect sizes a comparison")
