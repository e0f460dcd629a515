"""A sweep's jobs from submission to outcome, one step of the loop each.

`Submission.run` submits the jobs (at most the launcher's bound at once) and waits for them, the shown ones in
the live table, until each has a result or, on a cluster, is lost or stuck (ddl.launch.cluster). A job whose
dataset a prepare job makes (ddl.launch.data_jobs) is submitted depending on it, and fails with its error if it
fails. On a stop request nothing more is submitted, and local jobs get SIGTERM (they checkpoint and end KILLED);
cluster jobs still queued go on.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus

from .. import paths
from ..train.signals import DeferredSignals
from . import cluster, data_jobs, hydra_private, status, submitit_private
from .spec import Job


class Result(NamedTuple):
    """How a job of the sweep ended, as its summary row says."""
    state: str
    detail: str
    job_return: JobReturn | None = None
    reused_from: str | None = None       # the experiment whose run it reused


class Submission:
    """The jobs of one launch: those still to submit (`pending`), submitted (`running`) and ended (`outcomes`)."""

    def __init__(self, launcher, jobs: list[Job], first_idx: int, stop: DeferredSignals,
                 waits: dict[str, data_jobs.PrepareJob]):
        self.launcher, self.jobs, self.stop, self.waits = launcher, jobs, stop, waits
        self.executor = launcher.executor() if jobs else None
        self.pending = list(enumerate(jobs, start=first_idx))
        self.running: dict[str, Any] = {}
        self.outcomes: dict[str, Result] = {}
        self.limit = launcher.bound(len(jobs))
        self.watch = cluster.LostJobs(cluster.lost_after_seconds())
        self.prepared_by = {job.signature: waits.get(job.run.data.dataset_name()) for job in jobs}

    def run(self, shown: list[Job]) -> dict[str, Result]:
        from .table import live_table
        self.mark_queued()
        with live_table(shown, "SLURM job" if self.launcher._EXECUTOR == "slurm" else None) as refresh:
            while self.pending or self.running:
                self.collect_ended()
                self.follow_prepares()
                self.watch_cluster()
                if self.stop.received:
                    self.stop_jobs()
                self.submit_more()
                refresh({s: h.job_id for s, h in self.running.items()})
                time.sleep(1.0)
        return self.outcomes

    def mark_queued(self) -> None:
        """Each job's status: queued, named as the sweep names it (its MLflow run takes the label: job.run_task)."""
        for job in self.jobs:
            prepare = self.prepared_by[job.signature]
            status.write(paths.runs_dir() / job.signature, state="queued", name=job.name, label=job.label, step=0,
                         steps=job.run.train.steps, reused_from=None, error=None,
                         note=f"{data_jobs.WAITING} (SLURM job {prepare.job_id})" if prepare else None)

    def collect_ended(self) -> None:
        for signature, handle in list(self.running.items()):
            if _has_ended(handle):
                self.outcomes[signature] = outcome(handle, paths.runs_dir() / signature)
                del self.running[signature]

    def follow_prepares(self) -> None:
        """Each prepare job that ended this round: its line; its dataset's jobs released, or failed with it."""
        for prepare in self.waits.values():
            if prepare.poll():
                data_jobs.report(prepare)
                if prepare.done:
                    data_jobs.release([h.job_id for sig, h in self.running.items() if self.prepared_by[sig] is prepare])
            if prepare.error:
                self.fail_waiting(prepare)

    def fail_waiting(self, prepare: data_jobs.PrepareJob) -> None:
        """Its dataset will not come: the jobs waiting on a failed or lost prepare job fail with its line, those
        in the queue cancelled (their dependency can never be met), those not submitted never are."""
        waiting = {sig for sig, by in self.prepared_by.items() if by is prepare and sig not in self.outcomes}
        data_jobs.cancel([self.running[sig].job_id for sig in waiting if sig in self.running])
        for signature in waiting:
            self.running.pop(signature, None)
            self.fail(signature, prepare.error, f"{data_jobs.WAITING} (failed: {prepare.error})")
        self.pending = [(idx, job) for idx, job in self.pending if job.signature not in waiting]

    def fail(self, signature: str, error: str, detail: str) -> None:
        status.write(paths.runs_dir() / signature, state="failed", error=error, note=None)
        self.outcomes[signature] = Result("failed", detail)

    def watch_cluster(self) -> None:
        """Cluster jobs lost (out of the queue without a result), or stuck (pending for ever: cancelled, with
        the key to change)."""
        lost, stuck = self.watch.check(_on_cluster(self.running))
        for signature, state in lost.items():
            self.outcomes[signature] = lost_result(self.running.pop(signature), signature, state)
        if stuck:
            data_jobs.cancel([self.running[signature].job_id for signature in stuck])
        for signature, reason in stuck.items():
            handle = self.running.pop(signature)
            line = f"SLURM job {handle.job_id} was cancelled: {cluster.never_clears(reason)}"
            self.fail(signature, line, line)

    def stop_jobs(self) -> None:
        """A stop request: nothing more starts; local jobs get SIGTERM, cluster jobs are left running (or lost)."""
        self.outcomes.update({job.signature: Result("not started", "the sweep was stopped first")
                              for _, job in self.pending})
        self.pending = []
        gone = cluster.ended(_on_cluster(self.running))
        for signature, handle in list(self.running.items()):
            if signature in gone:
                self.outcomes[signature] = lost_result(self.running.pop(signature), signature, gone[signature])
            elif not _stop_local_job(handle):
                self.outcomes[signature] = Result("left running", f"on the cluster as job {handle.job_id}")
                del self.running[signature]

    def submit_more(self) -> None:
        """Jobs up to the bound; one waiting on a prepare job that has not ended depends on it."""
        while self.pending and len(self.running) < self.limit and not self.stop.received:   # a Ctrl-C meanwhile
            idx, job = self.pending.pop(0)
            if self.waits:
                prepare = self.prepared_by[job.signature]
                self.executor.update_parameters(slurm_additional_parameters={
                    **(self.launcher.params.get("additional_parameters") or {}),
                    **(prepare.dependency() if prepare else {})})
            slots = self.launcher.gpu_slots()
            if slots is not None:                          # its own GPUs: CUDA_VISIBLE_DEVICES of its tasks
                submitit_private.pin_local_gpus(self.executor, list(slots.take(job.signature, set(self.running))))
            with _children_ignore_sigint():
                self.running[job.signature] = self.executor.submit(self.launcher, job.overrides, "hydra.sweep.dir",
                                                                   idx, f"job_id_for_{idx}", Singleton.get_state())


def lost_result(handle, signature: str, state: str) -> Result:
    """A cluster job that left the queue without a result: its status and MLflow run say so (job.close_lost)."""
    from .job import close_lost
    why = (f"left the queue without a result ({state.lower().replace('_', ' ') or 'cancelled, or its node failed'})"
           f"; re-run the sweep to resume it")
    close_lost(signature, why)
    return Result(status.LOST, f"{why}  (log: {handle.paths.stderr})")


def outcome(handle, run_dir: Path) -> Result:
    """(state, detail, JobReturn): the job's own error line when it wrote one, else submitit's."""
    if _local_controller(handle) is not None:
        submitit_private.stop_waiting_for_results(handle)   # else 15 s a killed job, one after another
    try:
        result, error = handle.results()[0], None
    except Exception as err:  # the job process died or raised outside Hydra's run_job
        result, error = None, err
    if result is not None and result.status != JobStatus.FAILED:
        value = result.return_value or {}
        final = value.get("final")
        detail = f"val/loss {final.get('val/loss', float('nan')):.4f}" if final else value.get("detail", "")
        note = status.read(run_dir).get("note")        # what the store did meanwhile (an outage)
        return Result(value.get("status", "finished"), f"{detail}; {note}" if note else detail, result,
                      reused_from=value.get("reused_from"))       # a job that found its run finished elsewhere
    if error is None:
        error = hydra_private.job_exception(result)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    recorded = status.read(run_dir)
    detail = recorded.get("error") or (lines[-1] if lines else type(error).__name__)
    state = "killed" if recorded.get("state") == "killed" else "failed"
    return Result(state, f"{detail}  (log: {handle.paths.stderr})", result)


def _stop_local_job(handle) -> bool:
    """SIGTERM to a local job's controller, which passes it to its tasks; False for a cluster job."""
    controller = _local_controller(handle)
    if controller is None:
        return False
    with contextlib.suppress(ProcessLookupError):
        controller.send_signal(signal.SIGTERM)
    return True


def _local_controller(handle):
    """The process submitit started for a local job (it runs the job's tasks); None for a cluster job."""
    return submitit_private.local_process(handle)


def _on_cluster(running: dict) -> dict:
    return {signature: handle for signature, handle in running.items() if _local_controller(handle) is None}


def _has_ended(handle) -> bool:
    """A local job has ended when its process has; a cluster job when its result is there (without one,
    whether it is lost is cluster.LostJobs' to judge: submitit's `done()` would ask sacct)."""
    return handle.done() if _local_controller(handle) is not None else cluster.has_result(handle)


@contextlib.contextmanager
def _children_ignore_sigint():
    """A job started here ignores Ctrl-C: the terminal's SIGINT reaches the whole process group, and submitit's
    local controller would SIGKILL its tasks a second later, before they close their runs; the launcher stops
    them with SIGTERM instead. SIGINT is blocked while the job is submitted: its processes inherit the mask,
    where a SIGINT waits for ever, and a Ctrl-C that arrives meanwhile waits for the sweep, whose handler takes
    it as the block ends (ignoring the signal instead, as the sweep once did, lost it)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
