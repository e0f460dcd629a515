"""A sweep with a searched key (`'train.lr=tag(log, interval(3e-4, 3e-2))'`): each row's searches, then their
confirmation over fresh seeds, as rounds of ordinary jobs through the sweep's own launcher.

Each row is searched `tune.replicates` times, independently (each replicate its own search id, parent run, TPE
draws and seeds). Each round asks ddl.tune.workflow what every unfinished replicate runs next, from the trials the
store holds: new trials (TPE), its stopped trials to resume, and once it has its trials, what brackets its best
(a pruned trial finished with the pruner off, or a trial beyond the edge); it launches them all as one batch.
Each trial is a job like any other (signature, dedup, claim, journal, resume), tagged with its search and trial
number and a child of its replicate's parent run. A re-launch rebuilds every search from the store, so it trains no
trial twice, and a second home on the same server continues the same searches. Then each replicate's best runs
at fresh seeds, look by look (ddl.tune.sequential), paired with the baseline's replicate of the same number; a
row some replicate left unbracketed gets no verdict. With `tune.search_size`, only that size's rows are searched:
replicate r of a row of another size is carried, running replicate r's best from there at its fresh seeds.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from dataclasses import dataclass, field

from ..text import plural
from ..tune.config import TuneConfig
from ..tune.space import Dimension
from . import power
from .configs import ConfigError
from .spec import Job, row_name, size_name

WAIT_FOR_OTHERS_S = 10      # a round with nothing to launch while another home's runs train polls this often


@dataclass
class RowSearch:
    """One replicate of a row's search."""
    job: Job                             # the row, its searched keys at their defaults
    space: list[Dimension]
    source: RowSearch | None = None      # a carried row: its row's replicate at tune.search_size, whose best it runs
    replicate: int = 0
    factors: dict = field(default_factory=dict)    # a carried row: its source's best times these (the horizon rule)
    search: str = ""                     # the search's id: the row's signature, the space, replicate (and source)
    parent: str = ""                     # its parent MLflow run
    best: dict = field(default_factory=dict)       # the best trial's values
    best_loss: float | None = None
    open: list = field(default_factory=list)       # the edges of its best no finished trial brackets
    seeds: dict = field(default_factory=dict)      # confirmation seed -> final val/loss at the best values

    def __post_init__(self) -> None:
        spec = json.dumps([self.job.signature, [d.spec() for d in self.space], self.job.tuning.sampler_seed,
                           *([self.source.search] if self.source else []),
                           *([self.replicate] if self.replicate else []),       # replicate 0: the search before them
                           *([self.factors] if self.factors else [])])
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

    @property
    def bracketed(self) -> bool:
        return bool(self.best) and not self.open

    def parent_tags(self, row_search: str) -> dict:
        carried = {"ddl.carried_from": self.source.size, "ddl.source_search": self.source.search,
                   **({"ddl.carry_factors": json.dumps(self.factors)} if self.factors else {})} if self.source else {}
        return {"ddl.row": self.name, "ddl.space": " ".join(d.spec() for d in self.space),
                "ddl.replicate": str(self.replicate), "ddl.row_search": row_search, **carried}

    def runs(self, *roles: str) -> list:
        """The search's runs of these roles (trial, confirm) in the store, a damaged one left out (saying so)."""
        from ..track import searches
        return [t for t in searches.runs_of(self.job.experiment, self.search, keys=[d.key for d in self.space])
                if t.role in roles]

    def confirm_seeds(self, n: int) -> range:
        """The fresh seeds its confirmation runs for a look at n seeds a replicate."""
        return self.job.tuning.confirm_seeds(self.job.run.seed, self.replicate, n)

    def overrides(self, values: dict, role: str, number: int = -1, seed: int | None = None,
                  extra: tuple[str, ...] = ()) -> list[str]:
        """A trial's or confirmation run's overrides: the row's, the searched values, its seed and its identity
        (a trial runs at its replicate's selection seed)."""
        dims = {d.key: d for d in self.space}
        if seed is None and self.replicate:
            seed = self.job.tuning.selection_seed(self.job.run.seed, self.replicate)
        return [*self.job.overrides, *(dims[key].override(value) for key, value in values.items()),
                *([f"seed={seed}"] if seed is not None else []),
                f"tune.keys=[{','.join(dims)}]", f"tune.search={self.search}", f"tune.parent={self.parent}",
                f"tune.role={role}", f"tune.trial={number}", *extra]


def replicates_of(row: RowSearch, rows: list[RowSearch]) -> list[RowSearch]:
    """The replicates of a row (its own included), in order."""
    return [other for other in rows if other.job is row.job]


def run(launcher, row_overrides: list[list[str]], space: list[Dimension]) -> list:
    """The searches of every row, then the confirmation; the dry run prints the plan and launches nothing."""
    with launcher.refusal_leaves_nothing():
        rows, resolves = _sized(launcher, row_overrides, space)
    tuning = rows[0].job.tuning
    if launcher.config.dry_run:
        from . import data_jobs
        from .table import search_plan_table
        data = data_jobs.search_sentence(data_jobs.missing([row.job for row in rows]), launcher)
        search_plan_table(rows, tuning, launcher, data).print()
        print("\n".join(resolves))
        return []
    print("\n".join(resolves), flush=True)
    from ..track import searches
    from . import warm
    from .launcher import SweepFailed
    launcher.prepare_store({row.job.experiment for row in rows})
    try:
        for row in rows:
            first = replicates_of(row, rows)[0]
            row.parent = searches.parent_run(row.job.experiment, row.search,
                                             f"{'carried' if row.source else 'search'} {row.name}"
                                             + (f" replicate {row.replicate}" if row.replicate else ""),
                                             row.parent_tags(first.search))
    except searches.DamagedSearch as err:
        raise ConfigError(str(err)) from None
    with warm.shared_server(launcher.warm_starts()):          # one server for every round
        index = _search(launcher, [row for row in rows if row.source is None], tuning)
        try:
            _confirm(launcher, rows, tuning, index)
        except searches.DamagedSearch as err:
            raise SweepFailed(str(err)) from None
    return []


def _sized(launcher, row_overrides: list[list[str]], space: list[Dimension]) -> tuple[list[RowSearch], list[str]]:
    """The rows, their replicates and seeds sized by `detect=` where given (ddl.launch.power), and the lines saying
    what each compared row can resolve."""
    from ..tune.sequential import look_levels
    rows = plan_rows(launcher, row_overrides, space)
    detect, seed_sd = power.goal([row.job for row in rows])
    pairs = _compared(rows)
    if not pairs:
        if detect is not None:
            power.refuse_without_comparison(detect, [row.name for row in rows if row.replicate == 0])
        return rows, []
    spreads = {_setting(base): power.spread(base.job, seed_sd) for _, base in pairs}   # the store read once a setting
    tuning, sized = rows[0].job.tuning, []
    if detect is not None:
        design = max((power.design_needed(spreads[_setting(base)], detect, tuning.alpha, tuning.max_seeds,
                                          tuning.trials + tuning.bracket_trials,
                                          power.pilot_text(base.job, _gpus(launcher))) for _, base in pairs),
                     key=lambda d: d.units * (tuning.trials + tuning.bracket_trials + d.seeds))
        rows = plan_rows(launcher, [[*o, f"tune.replicates={design.units}", f"tune.seeds={design.seeds}"]
                                    for o in row_overrides], space)
        pairs, tuning = _compared(rows), rows[0].job.tuning
        sized = [f"ddl-run: detect={detect:g} sizes each row at tune.replicates={design.units} "
                 f"tune.seeds={design.seeds} (the cheapest in runs, seeds at most tune.max_seeds={tuning.max_seeds})"]
    level = look_levels(tuning.seed_plan, tuning.alpha)[-1]
    design = power.Design(tuning.replicates, tuning.seed_plan[-1], level, searched=True)
    by_base: dict[int, list] = {}
    for first, base in pairs:
        by_base.setdefault(id(base), []).append((first.job, design))
    bases = {id(base): base for _, base in pairs}
    return rows, sized + [line for key, designs in by_base.items()
                          for line in power.statement(designs, spreads[_setting(bases[key])],
                                                      power.pilot_text(bases[key].job, _gpus(launcher)))]


def _gpus(launcher) -> int:
    return launcher.params.get("gpus_per_node") or 0


def _setting(row: RowSearch) -> tuple:
    """What a row's seed spread depends on (ddl.launch.power.setting), which tune.* leaves alone."""
    return tuple(power.setting(row.job).items())


def _compared(rows: list[RowSearch]) -> list[tuple[RowSearch, RowSearch]]:
    """(a row's first replicate, its baseline's) for each row compared with a tuned baseline."""
    return [(first, base) for first in rows if first.replicate == 0 and (base := baseline_of(first, rows))]


def plan_rows(launcher, row_overrides: list[list[str]], space: list[Dimension]) -> list[RowSearch]:
    """The rows (one per distinct job), each composed and validated, and at each end of every range (or each
    choice) too: a value the key cannot take is one line before anything runs. Each row is tune.replicates
    searches."""
    plan = launcher.plan(row_overrides)
    for job in plan.jobs:
        launcher.plan([[*job.overrides, end] for d in space for end in d.ends()])
        if job.tuning.search or job.tuning.role:
            raise ConfigError(f"tune.search={job.tuning.search!r}: set by the search itself, not on the command line")
    settings = {job.tuning for job in plan.jobs}
    if len(settings) > 1:
        raise ConfigError("tune.*: one setting for the whole sweep; a list of tune values is not a sweep axis")
    tuning = settings.pop()
    firsts = _carried(plan.jobs, space, tuning)
    replicas: dict[int, list[RowSearch]] = {}
    for first in sorted(firsts, key=lambda row: row.source is not None):      # a carried row's source first
        sources = replicas[id(first.source)] if first.source else [None] * tuning.replicates
        replicas[id(first)] = [first, *(RowSearch(first.job, space, sources[r], r, first.factors)
                                        for r in range(1, tuning.replicates))]
    return [replicate for first in firsts for replicate in replicas[id(first)]]


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
        rows.append(RowSearch(job, space, source, factors=factors))
    return rows


def _search(launcher, rows: list[RowSearch], tuning: TuneConfig) -> int:
    """Rounds until every replicate has its trials and its best is bracketed, or cannot be; returns the next job
    index."""
    from ..track import searches
    from ..tune.workflow import next_round
    from .launcher import SweepFailed
    index, resumed, known, refused = 0, set(), -1, {}
    while True:
        batch, waiting, counted = [], False, 0
        for row in rows:
            # The numbers other runs hold, looked up before the trials are counted: a run another home opens between
            # the two looks is then at worst a number asked twice (the claim trains it once), never a trial counted
            # missing while its number is taken, which would ask a trial more under a new number.
            held = searches.numbers_taken(row.job.experiment, row.search)
            trials = row.runs("trial")
            counted += len(trials)
            step = next_round(trials, row.space, tuning, row.replicate, tuning.parallel or launcher.bound(len(rows)),
                              refused.setdefault(row.search, []))
            for trial in step.resume:
                if trial.run_id in resumed:
                    raise SweepFailed(f"search {row.name}: trial {trial.number} (MLflow run {trial.run_id}) stopped "
                                      f"twice; its log says why")
                resumed.add(trial.run_id)
                batch.append(row.overrides(trial.values, "trial", trial.number))
            batch += [row.overrides(t.values, "trial", t.number, extra=("tune.pruner=none",)) for t in step.finish]
            waiting |= step.waiting
            taken = {t.number for t in trials} | held
            free = (n for n in itertools.count() if n not in taken)        # the lowest numbers no run holds
            for values in step.new:
                overrides = row.overrides(values, "trial", next(free))
                if step.bracketing and not _valid(launcher, overrides):
                    refused[row.search].append(values)      # beyond what the key may take: the edge stays open
                    continue
                batch.append(overrides)
        if not batch and not waiting:
            return index
        if counted == known and not waiting and not any(refused.values()):
            raise SweepFailed("the search's last trials failed before their MLflow runs began; the summary above "
                              "says why")
        known = counted
        if not batch:
            if waiting:
                _wait_for_others("trials")
            continue
        print(f"ddl-run: search round: {plural(len(batch), 'trial')}", flush=True)
        try:
            launcher.launch(batch, index)
        except SweepFailed:      # a trial that diverged is the search's answer for its values; the rest goes on
            pass
        index += len(batch)


def _valid(launcher, overrides: list[str]) -> bool:
    """Whether a bracket trial's values (perhaps beyond the range) make a valid job."""
    try:
        launcher.plan([overrides])
    except ConfigError:
        return False
    return True


def _wait_for_others(what: str) -> None:
    """Another home trains some of the search's runs (its claims won): wait for them, polling the store."""
    print(f"ddl-run: waiting for {what} another home is training ({WAIT_FOR_OTHERS_S} s)", flush=True)
    time.sleep(WAIT_FOR_OTHERS_S)


def _best(row: RowSearch, tuning: TuneConfig) -> None:
    """The replicate's best trial's values and the edges no trial brackets (a carried row: its source's, found
    first), recorded on the parent run."""
    from ..track import searches
    from ..tune.bracket import best, open_edges
    if row.source is not None:
        row.best = {key: value * row.factors[key] if key in row.factors else value
                    for key, value in row.source.best.items()}
        row.open = row.source.open
        return
    trials = row.runs("trial")
    found = best(trials)
    if found is None:
        raise ConfigError(f"search {row.name}: none of its {plural(len(trials), 'trial')} finished "
                          f"(each diverged, was pruned or failed); widen or move the range")
    row.best, row.best_loss = found.values, found.value
    row.open = [str(edge) for edge in open_edges(trials, row.space)]
    searches.record_best(row.search, row.parent, {"best/val_loss": found.value,
                                                  **{f"best/{k}": v for k, v in found.values.items()
                                                     if isinstance(v, (int, float))}},
                         found.values, {"ddl.best_trial": found.number, "ddl.unbracketed": "; ".join(row.open)})


def baseline_of(row: RowSearch, rows: list[RowSearch]) -> RowSearch | None:
    """The tuned baseline a replicate pairs with: the same replicate of the baseline row of its size, data, schedule
    and replica (`replica`, an independent copy of a row); a baseline row of odd replica 2k+1 pairs with the
    baseline of replica 2k, an A/A pair (sweeps/tuned_aa.yaml)."""
    job = row.job
    if job.run.model.residual == "baseline":
        if job.run.replica % 2 == 0:
            return None
        replica = job.run.replica - 1
    else:
        replica = job.run.replica
    for other in rows:
        base = other.job
        if (base.run.model.residual == "baseline" and base is not job and other.replicate == row.replicate
                and base.run.replica == replica and size_name(base.run.model) == size_name(job.run.model)
                and base.run.data == job.run.data and base.run.train == job.run.train):
            return other
    return None


def _confirm(launcher, rows: list[RowSearch], tuning: TuneConfig, index: int) -> None:
    """Each bracketed row's replicates at fresh seeds, look by look (ddl.tune.sequential), until every row's gap to
    its tuned baseline resolves or the plan's maximum is reached (a row with no bracketed baseline: its first look,
    for its own estimate); then the result table."""
    from ..tune.sequential import look
    from .table import search_result_table
    for row in sorted(rows, key=lambda r: r.source is not None):
        _best(row, tuning)
    firsts = [row for row in rows if row.replicate == 0]
    plan, looks = tuning.seed_plan, {}
    open_rows = [first for first in firsts if _all_bracketed(first, rows)]
    for n in plan:
        wanted = {id(r): r for r in open_rows}
        wanted.update({id(b): b for b in (baseline_of(r, rows) for r in open_rows) if _all_bracketed(b, rows)})
        replicas = [r for first in wanted.values() for r in replicates_of(first, rows)]
        index = _confirmation_look(launcher, replicas, n, plan[-1], index)
        for first in list(open_rows):
            base = baseline_of(first, rows)
            if not _all_bracketed(base, rows):
                open_rows.remove(first)
                continue
            looks[first.search] = found = look(_seeds(first, rows), _seeds(base, rows), plan, tuning.alpha)
            if found.done:
                open_rows.remove(first)
        if not open_rows:
            break
    _record_verdicts(firsts, rows, looks)
    search_result_table(rows, looks, baseline_of, replicates_of).print()


def _all_bracketed(first: RowSearch | None, rows: list[RowSearch]) -> bool:
    return first is not None and all(r.bracketed for r in replicates_of(first, rows))


def _seeds(first: RowSearch, rows: list[RowSearch]) -> dict:
    return {r.replicate: r.seeds for r in replicates_of(first, rows)}


def _confirmation_look(launcher, replicas: list[RowSearch], n: int, most: int, index: int) -> int:
    """The replicates' confirmation runs up to `n` seeds each, launched and waited for (another home's too); each
    replicate's seeds then read from the store (of its first `most`). Returns the next job index."""
    from ..tune.workflow import confirmed
    from .launcher import SweepFailed
    batch = [r.overrides(r.best, "confirm", seed=seed) for r in replicas for seed in r.confirm_seeds(n)]
    if batch:
        print(f"ddl-run: confirmation at {plural(n, 'seed')} a replicate: {plural(len(batch), 'run')}", flush=True)
        try:
            launcher.launch(batch, index)
        except SweepFailed as err:
            print(f"ddl-run: {err}; the confirmation goes on with the seeds that finished", flush=True)
    while any(t.state == "running" for r in replicas for t in r.runs("confirm")):
        _wait_for_others("confirmation runs")
    for r in replicas:
        r.seeds = confirmed(r.runs("confirm"), r.best, set(r.confirm_seeds(most)))
    return index + len(batch)


def _record_verdicts(firsts: list[RowSearch], rows: list[RowSearch], looks: dict) -> None:
    """Each replicate's parent run: its best, the row's verdict, its baseline's search and the deciding look."""
    from ..track import searches
    from ..tune.workflow import verdict
    for first in firsts:
        base, found = baseline_of(first, rows), looks.get(first.search)
        said = verdict(found, _all_bracketed(first, rows) and (base is None or _all_bracketed(base, rows)))
        for row in replicates_of(first, rows):
            partner = baseline_of(row, rows)
            searches.record_best(row.search, row.parent, {}, row.best,
                                 {"ddl.verdict": said if base is not None else "",
                                  "ddl.baseline_search": partner.search if partner else "",
                                  "ddl.look_level": f"{found.level:.4g}" if found else "",
                                  "ddl.look_seeds": str(found.n) if found else ""})
            searches.close(row.search, row.parent)
