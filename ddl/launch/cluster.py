"""A sweep's SLURM jobs: whether each has a result, or has been lost.

submitit's `done()` learns that a job ended from `sacct`, which many small clusters cannot answer
(no accounting, no slurmdbd): it warns at every poll, and a job that died without a result
(cancelled, its node failed, killed for memory) looks like one still running for ever. So the
launcher reads a cluster job's result file itself and asks `squeue`, which answers on every
cluster: it lists a job while it is queued or running, and for MinJobAge (300 s by default) after
it ended, with its final state; then it no longer knows it. A job out of the queue without a
result whose status file has been silent for DDL_LOST_AFTER_S seconds (default 120) is lost: the
sweep stops waiting for it, and a re-run resumes it from its checkpoint.
"""

from __future__ import annotations

import contextlib
import subprocess
import time

from .. import paths
from . import status
from .configs import env_seconds

LOST_ENV, LOST_DEFAULT_S = "DDL_LOST_AFTER_S", 120.0
# The states of a job that has left for good (PREEMPTED is not one: a requeued job comes back).
ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                   "TIMEOUT"})


def lost_after_seconds() -> float:
    """How long a job out of the queue without a result may stay silent before it is lost; one line if bad."""
    return env_seconds(LOST_ENV, LOST_DEFAULT_S)


def has_result(job) -> bool:
    """Whether each task of the submitit job has written its result file; their folder's attributes are
    refreshed first, as submitit's `done()` does, lest a network filesystem's cached listing hide one."""
    from submitit.core.utils import JobPaths
    folder = job.paths.folder
    with contextlib.suppress(OSError):
        folder.chmod(folder.stat().st_mode)
    return all(JobPaths(folder, job.job_id, task).result_pickle.exists() for task in range(job.num_tasks))


def queue_states(job_ids: list[str]) -> dict[str, str] | None:
    """squeue's state of each of these jobs it still knows; None when it cannot answer (slurmctld down)."""
    try:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %T", f"--jobs={','.join(job_ids)}"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:     # it knows none of them, or cannot be asked
        return {} if "Invalid job id" in out.stderr else None
    return dict(line.split(maxsplit=1) for line in out.stdout.splitlines() if line.strip())


def ended(jobs: dict) -> dict[str, str]:
    """Of these submitit jobs (signature -> job), those out of the queue, or ended in it, without a result:
    signature -> their last state there ('' once it forgot them); none when squeue cannot answer."""
    states = queue_states([job.job_id for job in jobs.values()]) if jobs else {}
    if states is None:
        return {}
    return {signature: states.get(job.job_id, "") for signature, job in jobs.items()
            if states.get(job.job_id, "") in ENDED | {""} and not has_result(job)}


class LostJobs:
    """Which of a sweep's cluster jobs are lost: their status file unchanged for `after_s`, as this watch
    has seen it, and `ended`. It looks every quarter of that (at most every 30 s), and asks the queue
    only about the silent ones, once for all of them."""

    def __init__(self, after_s: float):
        self.after_s, self.every_s, self.next_check = after_s, min(30.0, after_s / 4), 0.0
        self.heard: dict[str, tuple] = {}     # signature -> (its status file's `updated`, when first seen so)

    def lost(self, jobs: dict) -> dict[str, str]:
        """The jobs (signature -> submitit job) lost by now: signature -> their last state in the queue."""
        now = time.monotonic()
        if now < self.next_check:
            return {}
        self.next_check = now + self.every_s
        return ended({signature: job for signature, job in jobs.items()
                      if self._silent_s(signature, now) >= self.after_s})

    def _silent_s(self, signature: str, now: float) -> float:
        updated = status.read(paths.runs_dir() / signature).get("updated")
        heard = self.heard.get(signature)
        if heard is None or heard[0] != updated:
            self.heard[signature] = heard = (updated, now)
        return now - heard[1]
