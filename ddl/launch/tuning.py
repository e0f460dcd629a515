"""A sweep with a searched key (`'train.lr=tag(log, interval(3e-4, 3e-2))'`): each row's search, then its
confirmation over seeds, as rounds of ordinary jobs through the sweep's own launcher.

Each round asks every unfinished row's search (ddl.tune.search, from the trials the store holds) for its
next `tune.parallel` trials, resumes its stopped ones, and launches them all as one batch: each trial is a
job like any other (signature, dedup, claim, journal, resume), tagged with its search and trial number and
a child of the row's parent run. A re-launch rebuilds every search from the store, so it trains no trial
twice, and a second home on the same server continues the same searches. When every row has its trials,
each row's best settings run at more seeds (seed 0 is the trial that found them), paired with the tuned
baseline of the same size; `tune.seeds=auto` adds seeds a batch at a time until the row's gap resolves
under the alpha-spending rule of ddl.tune.sequential, or the maximum is reached. With `tune.search_size`, only
that size's rows are searched: every row of another size is carried, its row's best values there run at its
confirmation's seeds (0 up: it has no trial), as a search of its own (an id, a parent run) with no trials.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from ..text import plural
from ..tune.config import TuneConfig
from ..tune.space import Dimension
from .configs import ConfigError
from .spec import Job, row_name, size_name

WAIT_FOR_OTHERS_S = 30      # a round with nothing to launch while another home's trials run polls this often


@dataclass
class RowSearch:
    job: Job                             # the row, its searched keys at their defaults
    space: list[Dimension]
    source: RowSearch | None = None      # a carried row: its row at tune.search_size, whose best it runs
    factors: dict = field(default_factory=dict)    # ... its best values times these (the horizon rule)
    search: str = ""                     # the search's id: the row's signature and the space (and its source's)
    parent: str = ""                     # its parent MLflow run
    best: dict = field(default_factory=dict)       # the best trial's values
    best_loss: float | None = None
    seeds: dict = field(default_factory=dict)      # seed -> final val/loss at the best values

    def __post_init__(self) -> None:
        spec = json.dumps([self.job.signature, [d.spec() for d in self.space], self.job.tuning.sampler_seed,
                           *([self.source.search] if self.source else []), *([self.factors] if self.factors else [])])
        self.search = hashlib.sha256(spec.encode()).hexdigest()[:10]

    @property
    def name(self) -> str:
        return self.job.name.replace(f"-s{self.job.run.seed}", "")

    @property
    def size(self) -> str:
        return size_name(self.job.run.model)

    @property
    def carried(self) -> str:
        """'carried from micro', with what the horizon rule multiplies ('train.lr x 0.5'); '' for a searched row."""
        if self.source is None:
            return ""
        return ", ".join([f"carried from {self.source.size}", *(f"{k} x {f:.3g}" for k, f in self.factors.items())])

    def parent_tags(self) -> dict:
        carried = {"ddl.carried_from": self.source.size, "ddl.source_search": self.source.search,
                   **({"ddl.carry_factors": json.dumps(self.factors)} if self.factors else {})} if self.source else {}
        return {"ddl.row": self.name, "ddl.space": " ".join(d.spec() for d in self.space), **carried}

    def confirm_seeds(self, n: int) -> range:
        """The seeds its confirmation runs for a look at n seeds: all n for a carried row, else all but the
        first, the trial that found the best."""
        first = self.job.run.seed
        return range(first + (self.source is None), first + n)

    def overrides(self, values: dict, role: str, number: int = -1, seed: int | None = None) -> list[str]:
        """A trial's or confirmation run's overrides: the row's, the searched values, and its identity."""
        dims = {d.key: d for d in self.space}
        return [*self.job.overrides, *(dims[key].override(value) for key, value in values.items()),
                *([f"seed={seed}"] if seed is not None else []),
                f"tune.keys=[{','.join(dims)}]", f"tune.search={self.search}", f"tune.parent={self.parent}",
                f"tune.role={role}", f"tune.trial={number}"]


def run(launcher, row_overrides: list[list[str]], space: list[Dimension]) -> list:
    """The search of every row, then the confirmation; the dry run prints the plan and launches nothing."""
    rows = plan_rows(launcher, row_overrides, space)
    tuning = rows[0].job.tuning
    if launcher.config.dry_run:
        from .table import search_plan_table
        search_plan_table(rows, tuning, launcher).print()
        return []
    from ..track import searches
    launcher.prepare_store({row.job.experiment for row in rows})
    for row in rows:
        row.parent = searches.parent_run(row.job.experiment, row.search,
                                         f"{'carried' if row.source else 'search'} {row.name}", row.parent_tags())
    index = _search(launcher, [row for row in rows if row.source is None], tuning)
    _confirm(launcher, rows, tuning, index)
    return []


def plan_rows(launcher, row_overrides: list[list[str]], space: list[Dimension]) -> list[RowSearch]:
    """The rows (one per distinct job), each composed and validated, and at each end of every range (or each
    choice) too: a value the key cannot take is one line before anything runs."""
    plan = launcher.plan(row_overrides)
    for job in plan.jobs:
        launcher.plan([[*job.overrides, end] for d in space for end in d.ends()])
        if job.tuning.search or job.tuning.role:
            raise ConfigError(f"tune.search={job.tuning.search!r}: set by the search itself, not on the command line")
    settings = {job.tuning for job in plan.jobs}
    if len(settings) > 1:
        raise ConfigError("tune.*: one setting for the whole sweep; a list of tune values is not a sweep axis")
    return _carried(plan.jobs, space, settings.pop())


def _carried(jobs: list[Job], space: list[Dimension], tuning: TuneConfig) -> list[RowSearch]:
    """The rows; with tune.search_size, a row of another size is carried from the row of that size with its
    row name, seed and label, its values moved by the horizon rule (ddl.tune.horizon)."""
    from ..tune.horizon import carry_factors
    size = tuning.search_size
    if size is None:
        return [RowSearch(job, space) for job in jobs]
    sizes = list(dict.fromkeys(size_name(job.run.model) for job in jobs))
    if size not in sizes:
        raise ConfigError(f"tune.search_size={size}: must be null or one of the sweep's sizes: {', '.join(sizes)}")

    def key(job: Job) -> tuple:
        return row_name(job.run.model), job.run.seed, job.label
    searched = {key(job): RowSearch(job, space) for job in jobs if size_name(job.run.model) == size}
    rows = []
    for job in jobs:
        if key(job) not in searched:
            raise ConfigError(f"tune.search_size={size}: {job.name} has no row at {size} to carry its best from")
        source = searched[key(job)]
        if source.job is job:
            rows.append(source)
            continue
        try:
            factors = carry_factors(source.job.run, job.run, [d.key for d in space], tuning.horizon_exponent,
                                    tuning.max_horizon_ratio)
        except ValueError as err:
            raise ConfigError(f"{err} ({source.name} to {job.name})") from None
        rows.append(RowSearch(job, space, source, factors))
    return rows


def _search(launcher, rows: list[RowSearch], tuning: TuneConfig) -> int:
    """Rounds until every row has its trials; returns the next job index."""
    from ..track import searches
    from ..tune.search import ask, grid_size
    from .launcher import SweepFailed
    index, resumed, known = 0, set(), -1
    while True:
        batch, waiting, counted = [], False, 0
        for row in rows:
            trials = [t for t in searches.runs_of(row.job.experiment, row.search) if t.role == "trial"]
            counted += len(trials)
            wanted = min(tuning.trials, grid_size(row.space) or tuning.trials)
            stopped = [t for t in trials if t.state == "stopped"]
            for trial in stopped:
                if trial.run_id in resumed:
                    raise SweepFailed(f"search {row.name}: trial {trial.number} (MLflow run {trial.run_id}) stopped "
                                      f"twice; its log says why")
                resumed.add(trial.run_id)
                batch.append(row.overrides(trial.values, "trial", trial.number))
            waiting |= any(t.state == "running" for t in trials)
            new = min(tuning.parallel or launcher.bound(len(rows)), wanted - len(trials))
            asked = ask(trials, row.space, tuning, max(0, new))
            batch += [row.overrides(values, "trial", len(trials) + i) for i, values in enumerate(asked)]
        if not batch and not waiting:
            return index
        if counted == known and not waiting:      # the last round's trials failed before their runs began
            raise SweepFailed("the search's last trials failed before their MLflow runs began; the summary above "
                              "says why")
        known = counted
        if not batch:
            print(f"ddl-run: waiting for trials another home is training ({WAIT_FOR_OTHERS_S} s)", flush=True)
            time.sleep(WAIT_FOR_OTHERS_S)
            continue
        print(f"ddl-run: search round: {plural(len(batch), 'trial')}", flush=True)
        try:
            launcher.launch(batch, index)
        except SweepFailed:      # a trial that diverged is the search's answer for its values; the rest goes on
            pass
        index += len(batch)


def _best(row: RowSearch) -> None:
    """The best trial's values (a carried row: its source's, found first), recorded on the parent run."""
    from ..track import searches
    if row.source is not None:
        row.best = {key: value * row.factors.get(key, 1.0) for key, value in row.source.best.items()}
        return
    trials = [t for t in searches.runs_of(row.job.experiment, row.search) if t.role == "trial"]
    complete = [t for t in trials if t.state == "complete"]
    if not complete:
        raise ConfigError(f"search {row.name}: none of its {plural(len(trials), 'trial')} finished "
                          f"(each diverged, was pruned or failed); widen or move the range")
    best = min(complete, key=lambda t: t.value)
    row.best, row.best_loss = best.values, best.value
    edges = [f"{d.key} at the edge of its range: widen the range" for d in row.space if _at_edge(d, best, complete)]
    searches.record_best(row.search, row.parent, {"best/val_loss": best.value,
                                                  **{f"best/{k}": v for k, v in best.values.items()
                                                     if isinstance(v, (int, float))}},
                         best.values, {"ddl.best_trial": best.number, "ddl.edge": "; ".join(edges)})


def _at_edge(dim: Dimension, best, complete) -> bool:
    """The best value is the lowest or highest one tried and within a tenth of the range of its end: the
    optimum may lie beyond it."""
    if dim.categorical:
        return False
    import math
    value = best.values[dim.key]
    tried = [t.values[dim.key] for t in complete]
    scale = math.log10 if dim.log else float
    near_low = scale(value) - scale(dim.low) <= dim.grid_step() and value <= min(tried)
    near_high = scale(dim.high) - scale(value) <= dim.grid_step() and value >= max(tried)
    return near_low or near_high


def baseline_of(row: RowSearch, rows: list[RowSearch]) -> RowSearch | None:
    """The tuned baseline a row pairs with: the baseline row of its size, data and schedule."""
    job = row.job
    for other in rows:
        base = other.job
        if (base.run.model.residual == "baseline" and other is not row and size_name(base.run.model)
                == size_name(job.run.model) and base.run.data == job.run.data and base.run.train == job.run.train):
            return other
    return None


def _confirm(launcher, rows: list[RowSearch], tuning: TuneConfig, index: int) -> None:
    """Each row's best at more seeds, look by look (ddl.tune.sequential), until every row's gap to its tuned
    baseline resolves or the plan's maximum is reached; then the result table."""
    from ..track import searches
    from ..tune.sequential import look
    from .launcher import SweepFailed
    from .table import search_result_table
    for row in sorted(rows, key=lambda r: r.source is not None):
        _best(row)
    plan, open_rows = tuning.seed_plan, list(rows)
    looks = {}
    for n in plan:
        wanted = {id(r): r for r in open_rows}
        wanted.update({id(b): b for b in (baseline_of(r, rows) for r in open_rows) if b is not None})
        batch = [row.overrides(row.best, "confirm", seed=seed) for row in wanted.values()
                 for seed in row.confirm_seeds(n)]
        if batch:
            print(f"ddl-run: confirmation at {plural(n, 'seed')}: {plural(len(batch), 'run')}", flush=True)
            try:
                launcher.launch(batch, index)
            except SweepFailed as err:
                print(f"ddl-run: {err}; the confirmation goes on with the seeds that finished", flush=True)
            index += len(batch)
        for row in wanted.values():
            row.seeds = {t.seed: t.value for t in searches.runs_of(row.job.experiment, row.search)
                         if t.state == "complete" and t.values == row.best}
        for row in list(open_rows):
            base = baseline_of(row, rows)
            if base is None:
                open_rows.remove(row)
                continue
            looks[row.search] = found = look(row.seeds, base.seeds, plan, tuning.alpha)
            if found.done:
                open_rows.remove(row)
        if not open_rows:
            break
    for row in rows:
        base, found = baseline_of(row, rows), looks.get(row.search)
        verdict = "" if found is None or found.difference is None else found.difference.verdict(False)
        searches.record_best(row.search, row.parent, {}, row.best,
                             {"ddl.verdict": verdict, "ddl.baseline_search": base.search if base else "",
                              "ddl.look_level": f"{found.level:.4g}" if found else ""})
        searches.close(row.search, row.parent)
    search_result_table(rows, looks, baseline_of).print()
