"""Hydra launchers for sweeps: hydra-submitit-launcher's, with the planning a researcher can trust.

`launch` composes and validates every job before anything runs, collapses jobs with the same
signature, skips the ones already finished in this sweep's experiment, then submits the rest
through submitit (at most `max_parallel` at once), shows one live line per job and ends with
a summary. The job itself is hydra-submitit-launcher's `__call__` (it re-runs the Hydra job),
and so is `checkpoint()`: a requeued job re-runs with the same overrides and resumes from the
checkpoint found by its signature.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf

from .. import paths
from . import status
from .configs import ConfigError
from .plan import Plan, make_plan
from .spec import Job
from .table import job_table, live_table, summary_table


class SweepFailed(RuntimeError):
    """Some jobs failed; the summary has been printed."""


class SweepLauncher(BaseSubmititLauncher):
    def __init__(self, max_parallel: int | None = None, **params: Any) -> None:
        super().__init__(**params)
        self.max_parallel = max_parallel

    # -- planning ---------------------------------------------------------------------------
    def plan(self, job_overrides: Sequence[Sequence[str]]) -> Plan:
        """Hydra composes each override set; the plan itself is ddl.launch.plan's."""
        loader = self.hydra_context.config_loader
        return make_plan((list(filter_overrides(overrides)), loader.load_sweep_config(self.config, list(overrides)))
                         for overrides in job_overrides)

    # -- submission -------------------------------------------------------------------------
    def executor(self):
        import submitit
        params = dict(self.params)
        folder = params.pop("submitit_folder")
        init = {f"{self._EXECUTOR}_max_num_timeout": params.pop("max_num_timeout")} if "max_num_timeout" in params else {}
        executor = submitit.AutoExecutor(folder=folder, cluster=self._EXECUTOR, **init)
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in shared else f"{self._EXECUTOR}_{k}": v for k, v in params.items()})
        return executor

    def bound(self, n_jobs: int) -> int:
        if self.max_parallel:
            return self.max_parallel
        if self._EXECUTOR == "local":
            return max(1, len(os.sched_getaffinity(0)) // max(1, self.params.get("cpus_per_task") or 1))
        return n_jobs

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        plan = self.plan(job_overrides)
        print(plan.headline())
        if self.config.dry_run:
            job_table(plan.jobs, self.params.get("gpus_per_node") or 0, self.bound(len(plan.jobs)),
                      self.params.get("cpus_per_task") or 1).print()
            return []
        skipped = plan.finished()
        todo = [j for j in plan.jobs if j.signature not in skipped]
        self.prepare_store({j.experiment for j in plan.jobs})
        os.environ.setdefault("DDL_CPUS", str(self.params.get("cpus_per_task") or 1))
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        outcomes = self.run_jobs(todo, initial_job_idx) if todo else {}
        rows = [(j, "skipped", f"finished before: MLflow run {skipped[j.signature]['run_id']}")
                if j.signature in skipped else (j, *outcomes[j.signature][:2]) for j in plan.jobs]
        summary_table(rows).print()
        if any(state != "finished" and state != "skipped" for _, state, _ in rows):
            raise SweepFailed(f"{sum(s not in ('finished', 'skipped') for _, s, _ in rows)} of {len(rows)} jobs failed")
        return [outcomes[j.signature][2] for j in todo]

    @staticmethod
    def prepare_store(experiments: set[str]) -> None:
        """Create the store and the experiments once, before parallel writers; a deleted one is a ConfigError."""
        from ..track import store
        for experiment in experiments:
            try:
                store.experiment_id(experiment)
            except ValueError as err:
                raise ConfigError(str(err)) from None

    def run_jobs(self, jobs: list[Job], first_idx: int) -> dict[str, tuple[str, str, JobReturn | None]]:
        executor = self.executor()
        pending = list(enumerate(jobs, start=first_idx))
        running: dict[str, Any] = {}
        outcomes: dict[str, tuple[str, str, JobReturn | None]] = {}
        limit = self.bound(len(jobs))
        for job in jobs:
            status.write(paths.runs_dir() / job.signature, state="queued", name=job.name, step=0,
                         steps=job.run.train.steps, error=None)
        with live_table(jobs) as refresh:
            while pending or running:
                while pending and len(running) < limit:
                    idx, job = pending.pop(0)
                    running[job.signature] = executor.submit(self, job.overrides, "hydra.sweep.dir", idx,
                                                             f"job_id_for_{idx}", Singleton.get_state())
                for signature, handle in list(running.items()):
                    if handle.done():
                        outcomes[signature] = self.outcome(handle, paths.runs_dir() / signature)
                        del running[signature]
                refresh({s: h.job_id for s, h in running.items()})
                time.sleep(1.0)
        return outcomes

    @staticmethod
    def outcome(handle, run_dir: Path) -> tuple[str, str, JobReturn | None]:
        """(state, detail, JobReturn): the job's own error line when it wrote one, else submitit's."""
        try:
            result, error = handle.results()[0], None
        except Exception as err:  # the job process died or raised outside Hydra's run_job
            result, error = None, err
        if result is not None and result.status != JobStatus.FAILED:
            value = result.return_value or {}
            return value.get("status", "finished"), f"val/loss {value.get('final', {}).get('val/loss', float('nan')):.4f}", result
        if error is None:
            error = result._return_value  # Hydra keeps the task's exception here
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        recorded = status.read(run_dir).get("error") or (lines[-1] if lines else type(error).__name__)
        return "failed", f"{recorded}  (log: {handle.paths.stderr})", result
