"""Hydra launchers for sweeps: hydra-submitit-launcher's, with the planning a researcher can trust.

`launch` composes and validates every job before anything runs, collapses jobs with the same
signature, skips the ones already finished in this sweep's experiment, reuses (in this process,
launching nothing) the ones finished in another experiment, then submits the rest through
submitit (at most `max_parallel` at once), shows one live line per job and ends with a summary. A
cluster job that left the queue without a result is lost (ddl.launch.cluster): the wait for it ends.
The job itself is hydra-submitit-launcher's `__call__` (it re-runs the Hydra job), and so is
`checkpoint()`: a requeued job re-runs with the same overrides and resumes from the
checkpoint found by its signature.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any, Sequence

from hydra.core.utils import JobReturn, filter_overrides
from hydra.errors import HydraException
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .. import paths
from ..text import plural
from ..track.filesystems import warn_if_sqlite_on_network
from ..train.signals import DeferredSignals
from . import cluster, data_jobs, power, status, warm
from .compose import JobConfigs
from .gpus import GpuSlots, machine_gpus
from .configs import ConfigError
from .plan import Plan, make_plan
from .spec import Job
from .submission import Result, Submission


class SweepFailed(RuntimeError):
    """Some jobs failed; the summary has been printed."""


class SweepInterrupted(RuntimeError):
    """Ctrl-C or SIGTERM stopped the sweep: its running jobs ended KILLED; the summary has been printed."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}; its jobs resume when it is run again")
        self.signum = signum


class SweepLauncher(BaseSubmititLauncher):
    def __init__(self, max_parallel: int | None = None, gpu_memory_gib: float | None = None,
                 warm_start: bool = False, **params: Any) -> None:
        super().__init__(**params)
        self.max_parallel, self.gpu_memory_gib, self.warm_start = max_parallel, gpu_memory_gib, warm_start
        self.local_python: str | None = None     # submitit's local `python`: a warm server's client (ddl.launch.warm)
        self._job_configs: JobConfigs | None = None
        self._gpu_slots: GpuSlots | None = None

    # -- planning ---------------------------------------------------------------------------
    def job_configs(self) -> JobConfigs:
        """The sweep's compositions (ddl.launch.compose), kept while its config stays the one Hydra set up: a
        search plans its rows, the ends of their ranges and each round's trials, all on the same groups."""
        if self._job_configs is None or self._job_configs.master is not self.config:
            self._job_configs = JobConfigs(self.hydra_context.config_loader, self.config)
        return self._job_configs

    def plan(self, job_overrides: Sequence[Sequence[str]]) -> Plan:
        """Each override set's config as Hydra composes it (ddl.launch.compose); the plan is ddl.launch.plan's."""
        configs = self.job_configs()
        return make_plan((list(filter_overrides(overrides)), configs(list(overrides))) for overrides in job_overrides)

    def check_fit(self, jobs: list[Job]) -> None:
        """One line refusing the first job the launcher could not start: its step's tokens do not split evenly over
        its ranks' micro-batches, or (with GPUs) its estimated memory exceeds a GPU's (gpu_memory_gib). Each names
        the micro-batches that would do."""
        from .estimate import job_cost, with_micro_batch
        if self.gpu_memory_gib is not None and not self.gpu_memory_gib > 0:
            raise ConfigError(f"hydra.launcher.gpu_memory_gib={self.gpu_memory_gib:g}: must be a number of GiB > 0")
        world = (self.params.get("nodes") or 1) * (self.params.get("tasks_per_node") or 1)
        gpus = self.params.get("gpus_per_node") or 0
        for job in jobs:
            train = job.run.train
            divide = [m for m in range(train.micro_batch, 0, -1)
                      if not train.batch_tokens % (m * train.seq_len * world)]
            if train.micro_batch not in divide:
                raise ConfigError(f"train.micro_batch={train.micro_batch}: {train.batch_tokens:,} tokens a step do not "
                                  f"split over {world} ranks x micro_batch x {train.seq_len}; micro-batches that "
                                  f"divide: {', '.join(map(str, divide)) or 'none'}  [job {job.name}]")
            cost, limit = job_cost(job, gpus), (self.gpu_memory_gib or float("inf")) * 2 ** 30
            if gpus and cost.cpu_seconds is None and cost.gpu_memory > limit:
                fitting = [m for m in divide if job_cost(with_micro_batch(job, m), gpus).gpu_memory <= limit]
                raise ConfigError(f"train.micro_batch={train.micro_batch}: job {job.name} needs ~"
                                  f"{cost.gpu_memory / 2 ** 30:.0f} GiB per GPU (hydra.launcher.gpu_memory_gib="
                                  f"{self.gpu_memory_gib:g}): micro-batches that fit: "
                                  f"{', '.join(map(str, fitting[:3])) or 'none'}, or "
                                  f"train.activation_checkpointing=true")

    # Counts of a job's (or the prepare job's) resources: null takes SLURM's default where the key may be null.
    COUNTS = ("nodes", "tasks_per_node", "cpus_per_task", "timeout_min", "mem_gb", "prepare_cpus_per_task",
              "prepare_mem_gb", "prepare_timeout_min")

    def warm_starts(self) -> bool:
        """Whether jobs fork from a warm server (ddl.launch.warm): local CPU jobs (a GPU job's CUDA must not meet a
        fork), unless hydra.launcher.warm_start=false."""
        return self._EXECUTOR == "local" and self.warm_start and not self.params.get("gpus_per_node")

    @staticmethod
    def check_locks() -> None:
        from .. import locks
        try:
            locks.mode()
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def check_params(self) -> None:
        """One line for a launcher setting no job script can carry: a string off one line, a count below 1."""
        for key, value in self.params.items():   # each one may become a line of a job script
            if isinstance(value, str) and not value.isprintable():
                raise ConfigError(f"hydra.launcher.{key}={value!r}: must be printable, on one line")
            if key in self.COUNTS and value is not None and not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"hydra.launcher.{key}={value}: must be an integer >= 1")

    # -- submission -------------------------------------------------------------------------
    def executor(self):
        """Upstream's executor, built as its `launch` builds it inline (no method of its own to call)."""
        import submitit
        params = {k: v for k, v in self.params.items() if k not in data_jobs.PREPARE_KEYS}   # the prepare job's own
        folder = params.pop("submitit_folder")
        init = {f"{self._EXECUTOR}_max_num_timeout": params.pop("max_num_timeout")} \
            if "max_num_timeout" in params else {}
        if self.local_python:
            init["local_python"] = self.local_python
        executor = submitit.AutoExecutor(folder=folder, cluster=self._EXECUTOR, **init)
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in shared else f"{self._EXECUTOR}_{k}": v for k, v in params.items()})
        return executor

    def bound(self, n_jobs: int) -> int:
        """How many jobs run at once: max_parallel, and locally at most what the CPUs (or the GPUs) hold."""
        slots = self.gpu_slots()
        if slots is not None:
            return min(self.max_parallel or len(slots.groups), len(slots.groups))     # never two jobs on one GPU
        if self.max_parallel:
            return self.max_parallel
        if self._EXECUTOR == "local":
            return max(1, len(os.sched_getaffinity(0)) // max(1, self.params.get("cpus_per_task") or 1))
        return n_jobs

    def gpu_slots(self) -> GpuSlots | None:
        """The machine's GPUs in groups of gpus_per_node, for the local launcher's jobs (ddl.launch.gpus); None
        without GPU jobs, or on a cluster. A job asking more GPUs than the machine has is one line."""
        per_job = self.params.get("gpus_per_node") or 0
        if self._EXECUTOR != "local" or not per_job:
            return None
        if self._gpu_slots is None:
            try:
                found, source = machine_gpus()
            except ValueError as err:
                raise ConfigError(str(err)) from None
            if per_job > len(found):
                has = plural(len(found), "GPU") if found else "no GPU"
                raise ConfigError(f"hydra.launcher.gpus_per_node={per_job}: this machine has {has} ({source}); "
                                  f"ask {f'at most {len(found)}, or ' if found else ''}0 to train on CPU")
            self._gpu_slots = GpuSlots(found, per_job)
        return self._gpu_slots

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from .table import job_table, progress_seconds   # rich: not for every ddl-run (Hydra imports launchers)
        with self.refusal_leaves_nothing():
            self.check_params()
            progress_seconds()                       # a bad DDL_PROGRESS_S, DDL_LOST_AFTER_S or DDL_LOCKS is one
            cluster.lost_after_seconds()             # line, before anything runs
            self.check_locks()
            self.gpu_slots()
            gpus = self.params.get("gpus_per_node") or 0
            plan, resolves = power.plan_seeds(self, self.plan(job_overrides), gpus)
            self.check_fit(plan.jobs)
            print(plan.headline())
            needs = self.missing_data(plan.jobs)
            if self.config.dry_run:
                job_table(plan.jobs, gpus, self.bound(len(plan.jobs)), self.params.get("cpus_per_task") or 1,
                          data_jobs.plan(needs, self)).print()
                print("\n".join(resolves))
                return []
            print("\n".join(resolves), flush=True)
            if needs and self._EXECUTOR == "local":   # here, first, on the machine's cores: a bad source leaves
                data_jobs.prepare_here(needs)           # nothing (this block's refusal)
            self.prepare_store({j.experiment for j in plan.jobs})
        warn_if_sqlite_on_network(self._EXECUTOR)      # SQLite on NFS/Lustre under SLURM: say what to run instead
        skipped = plan.finished()
        reusable = plan.reusable(skipped)
        elsewhere = plan.running_elsewhere(skipped | reusable.keys())
        todo = [j for j in plan.jobs if j.signature not in skipped | reusable.keys() | elsewhere.keys()]
        shown = [j for j in plan.jobs if j.signature in reusable or j in todo]     # in the live table
        os.environ.setdefault("DDL_CPUS", str(self.params.get("cpus_per_task") or 1))
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        with DeferredSignals((signal.SIGINT, signal.SIGTERM)) as stop, \
                warm.local_python(self.warm_starts(), len(todo)) as python:
            self.local_python = python              # stop the jobs, then print the summary
            outcomes = self.reuse_jobs([(j, reusable[j.signature]) for j in plan.jobs if j.signature in reusable],
                                       stop)
            waits = data_jobs.submit(self, data_jobs.missing(todo)) if self._EXECUTOR == "slurm" and todo else {}
            outcomes.update(self.run_jobs(todo, shown, initial_job_idx, stop, waits) if shown else {})
        outcomes.update({sig: Result(status.ELSEWHERE, f"{who}; not started here") for sig, who in elsewhere.items()})
        outcomes.update({sig: Result("skipped", f"finished before: MLflow run {found.run_id}"
                                     + (f", trained by {found.trained_by}" if found.trained_by else ""))
                         for sig, found in skipped.items()})
        self.summarise(plan.jobs, outcomes, stop)
        return [outcomes[j.signature].job_return for j in todo]

    @staticmethod
    def missing_data(jobs: list[Job]) -> list[data_jobs.DataNeed]:
        """The datasets not prepared yet that jobs to run read (the store asked only when one is missing, and
        only read: a dry run writes nothing)."""
        from .plan import already_done
        if not data_jobs.missing(jobs):
            return []
        done = already_done(jobs)
        return data_jobs.missing([job for job in jobs if job.signature not in done])

    @staticmethod
    def summarise(jobs: list[Job], outcomes: dict[str, "Result"], stop: DeferredSignals) -> None:
        from .table import summary_table
        rows = [(j, *outcomes[j.signature][:2], outcomes[j.signature].reused_from) for j in jobs]
        summary_table(rows).print()
        if stop.received:
            raise SweepInterrupted(stop.received)
        ok = ("finished", "skipped", "pruned", status.REUSED, status.ELSEWHERE)
        failed = [state for _, state, *_ in rows if state not in ok]
        if failed:
            lost = failed.count(status.LOST)
            raise SweepFailed(f"{len(failed)} of {plural(len(rows), 'job')} failed"
                              + (f" ({lost} lost: run the sweep again to resume)" if lost else ""))

    @staticmethod
    def reuse_jobs(reusable: list, stop: DeferredSignals) -> dict[str, "Result"]:
        """Jobs finished in another experiment ((job, store.Stored) pairs), copied into theirs here, in this
        process: no job is launched."""
        from .job import reuse
        outcomes = {}
        for job, found in reusable:
            if stop.received:
                outcomes[job.signature] = Result("not started", "the sweep was stopped first")
                continue
            done = reuse(job, found)
            if done["status"] == status.ELSEWHERE:
                outcomes[job.signature] = Result(status.ELSEWHERE, f"{done['detail']}; not reused here")
                continue
            val_loss = done["final"].get("val/loss")
            outcomes[job.signature] = Result(status.REUSED, f"val/loss {val_loss:.4f}, MLflow run {done['run_id']}",
                                             reused_from=found.experiment)
        return outcomes

    @contextlib.contextmanager
    def refusal_leaves_nothing(self):
        """A refused sweep leaves nothing, as a refused run does: the multirun.yaml Hydra's sweeper wrote
        before the launcher's checks (ddl's, or Hydra's of a job's overrides) goes, with each folder of
        DDL_HOME it leaves empty. A store that cannot be used (a plan asks it what is done) is such a refusal,
        in its one line, as for a run."""
        from ..track.store import StoreError
        try:
            yield
        except (ConfigError, HydraException, OmegaConfBaseException, StoreError) as err:
            folder = Path(str(self.config.hydra.sweep.dir))
            (folder / "multirun.yaml").unlink(missing_ok=True)
            paths.prune(folder)
            if isinstance(err, StoreError):
                raise ConfigError(str(err)) from None
            raise

    @staticmethod
    def prepare_store(experiments: set[str]) -> None:
        """Create the store and the experiments once, before parallel writers; a deleted one is a ConfigError."""
        from ..track import store
        for experiment in experiments:
            try:
                store.experiment_id(experiment)
            except ValueError as err:
                raise ConfigError(str(err)) from None

    def run_jobs(self, jobs: list[Job], shown: list[Job], first_idx: int, stop: DeferredSignals,
                 waits: dict[str, data_jobs.PrepareJob] | None = None) -> dict[str, Result]:
        """Submit the jobs and wait for each to end (ddl.launch.submission): signature -> its Result."""
        return Submission(self, jobs, first_idx, stop, waits or {}).run(shown)
