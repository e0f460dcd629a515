"""A sweep's plan, before anything runs: every job validated, jobs of one signature collapsed, and
the jobs already finished in their experiment set aside. Pure, but for reading status files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from omegaconf import DictConfig

from .. import paths
from ..model.config import DDL_KNOBS
from ..text import plural
from . import status
from .configs import ConfigError
from .schema import AXES
from .spec import Job


@dataclass
class Plan:
    jobs: list[Job]                                                     # distinct, in sweep order
    duplicates: dict[str, list[list[str]]] = field(default_factory=dict)  # signature -> the overrides it absorbed
    n_override_sets: int = 0
    _store: object = field(default=None, init=False, repr=False)     # store_lookup's, once asked

    def store_lookup(self):
        """The store's runs of the plan's signatures, read once for all the plan's questions (store.Lookup)."""
        from ..track import store
        if self._store is None:
            self._store = store.Lookup(j.signature for j in self.jobs)
        return self._store

    def headline(self) -> str:
        line = f"{plural(self.n_override_sets, 'override set')} -> {plural(len(self.jobs), 'distinct job')}"
        if self.duplicates:
            signature, same = next(iter(self.duplicates.items()))
            kept = next(j for j in self.jobs if j.signature == signature)
            shared = sum(map(len, self.duplicates.values()))
            line += (f" ({shared} {'shares' if shared == 1 else 'share'} a signature with another, e.g. "
                     f"{' '.join(same[0])} == {' '.join(kept.overrides)})")
        return line

    def finished(self, rebuild: bool = True) -> dict:
        """signature -> its FINISHED run in the store (store.Stored), for the jobs already finished (with every
        evaluation asked for) in their experiment, by any home; a run the store lost comes back from its
        folder's journal (`rebuild`)."""
        found = {j.signature: status.finished_in(paths.runs_dir() / j.signature, j.signature, j.experiment,
                                                 j.evaluation.evaluations(), rebuild, self.store_lookup())
                 for j in self.jobs}
        return {signature: stored for signature, stored in found.items() if stored}

    def reusable(self, finished: dict) -> dict:
        """signature -> the FINISHED run (store.Stored) of another experiment, for the jobs not `finished` here
        that finished there with every evaluation asked for: their runs are copied, nothing is launched."""
        from ..track import store
        found = {j.signature: store.finished_elsewhere(j.signature, j.experiment, j.evaluation.evaluations(),
                                                       self.store_lookup())
                 for j in self.jobs if j.signature not in finished}
        return {signature: stored for signature, stored in found.items() if stored}

    def running_elsewhere(self, exclude) -> dict[str, str]:
        """signature -> who trains it now, for the jobs another process of this home (its lock) or another
        home (a RUNNING run with a fresh heartbeat in the store) is training."""
        from ..track import store
        found, lookup = {}, self.store_lookup()
        for job in self.jobs:
            if job.signature not in exclude:
                who = status.holder(paths.runs_dir() / job.signature) or store.running_elsewhere(job.signature,
                                                                                                 lookup=lookup)
                if who:
                    found[job.signature] = who
        return found


def already_done(jobs: list[Job]) -> dict[str, str]:
    """For a dry run, creating no store and writing nothing: signature -> `finished (skipped)` for the jobs
    finished in their experiment, `reused (from experiment X)` for those another experiment finished."""
    from ..track import store
    if not store.exists():
        return {}
    plan = Plan(list(jobs))
    finished = plan.finished(rebuild=False)
    return {**{signature: "finished (skipped)" for signature in finished},
            **{signature: status.reused(found.experiment) for signature, found in plan.reusable(finished).items()}}


def make_plan(configs: Iterable[tuple[list[str], DictConfig]]) -> Plan:
    """(overrides shown to the user, composed config) per override set -> the Plan; the first invalid
    job is one ConfigError line naming its overrides."""
    plan = Plan([])
    by_signature: dict[str, Job] = {}
    for shown, cfg in configs:
        plan.n_override_sets += 1
        try:
            job = Job.from_config(cfg, shown)
        except ConfigError as err:
            raise ConfigError(f"{err}  [in job: {' '.join(shown)}]") from None
        if job.signature in by_signature:
            plan.duplicates.setdefault(job.signature, []).append(shown)
        else:
            by_signature[job.signature] = job
    plan.jobs = label_jobs(list(by_signature.values()))
    return plan


def _setting(key: str) -> str:
    """A config key as ddl-run takes it: model.beta_init -> beta_init, model.k_eps -> ddl.k_eps."""
    field = key.removeprefix("model.")
    if field in AXES:
        return field
    return f"ddl.{field}" if field in DDL_KNOBS else key


def label_jobs(jobs: list[Job]) -> list[Job]:
    """Jobs that would share a name (row, size, seed) get a label: the settings in which they differ
    from each other (`beta_init=0.5`), as the report's rows do. Distinct jobs have distinct effective
    configs, so their names are distinct."""
    groups: dict[str, list[tuple[Job, dict]]] = {}
    for job in jobs:
        groups.setdefault(job.base_name, []).append((job, job.params()))
    for group in groups.values():
        keys = dict.fromkeys(key for _, settings in group for key in settings)
        varying = [key for key in keys if len({repr(settings.get(key)) for _, settings in group}) > 1]
        for job, settings in group if len(group) > 1 else ():
            job.label = " ".join(f"{_setting(key)}={settings[key]}" for key in varying if key in settings)
    return jobs
