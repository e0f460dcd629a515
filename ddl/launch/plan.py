"""A sweep's plan, before anything runs: every job validated, jobs of one signature collapsed, and
the jobs already finished in their experiment set aside. Pure, but for reading status files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from omegaconf import DictConfig

from .. import paths
from . import status
from .configs import ConfigError
from .spec import Job


@dataclass
class Plan:
    jobs: list[Job]                                                     # distinct, in sweep order
    duplicates: dict[str, list[list[str]]] = field(default_factory=dict)  # signature -> the overrides it absorbed
    n_override_sets: int = 0

    def headline(self) -> str:
        line = f"{self.n_override_sets} override sets -> {len(self.jobs)} distinct jobs"
        if self.duplicates:
            signature, same = next(iter(self.duplicates.items()))
            kept = next(j for j in self.jobs if j.signature == signature)
            line += (f" ({sum(map(len, self.duplicates.values()))} share a signature with another, e.g. "
                     f"{' '.join(same[0])} == {' '.join(kept.overrides)})")
        return line

    def finished(self) -> dict[str, dict]:
        """signature -> its done.json entry, for the jobs already finished (with every evaluation
        asked for) in their experiment."""
        found = {j.signature: status.finished_in(paths.runs_dir() / j.signature, j.experiment,
                                                 j.evaluation.evaluations()) for j in self.jobs}
        return {signature: entry for signature, entry in found.items() if entry}


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
    plan.jobs = list(by_signature.values())
    return plan
