"""A sweep's SLURM jobs: whether each has a result, or has been lost.

submitit's `done()` learns that a job ended from `sacct`, which many small clusters cannot answer
(no accounting, no slurmdbd): it warns at every poll, and a job that died without a result
(cancelled, its node failed, killed for memory) looks like one still running for ever. So the
launcher reads a cluster job's result file itself and asks `squeue`, which answers on every
cluster: it lists a job while it is queued or running, and for MinJobAge (300 s by default) after
it ended, with its final state; then it no longer knows it. A job out of the queue without a
result whose status file has been silent for DDL_LOST_AFTER_S seconds (default 120) is lost: the
sweep stops waiting for it, and a re-run resumes it from its checkpoint. A job SLURM keeps pending for a
reason that never clears (`PartitionConfig`: it asks more than any node has) is stuck: the sweep cancels it
and says which key to change, rather than wait for ever.
"""

from __future__ import annotations

import contextlib
import os
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


# Why SLURM keeps a job pending where the reason never clears by itself, and what to change (a launcher key's
# prefix: "" for a training job, "prepare_" for a prepare job).
NEVER_CLEARS = {
    "PartitionConfig": "it asks more than the partition's nodes have: lower hydra.launcher.{resources}, or set "
                       "hydra.launcher.{p}partition",
    "PartitionNodeLimit": "it asks more nodes than the partition allows: lower hydra.launcher.nodes, or set "
                          "hydra.launcher.{p}partition",
    "PartitionTimeLimit": "its time limit is over the partition's: lower hydra.launcher.{p}timeout_min",
    "BadConstraints": "no node of the partition meets it: lower hydra.launcher.{resources}",
    "DependencyNeverSatisfied": "the job it depends on ended without success: run the sweep again",
    "InvalidAccount": "set hydra.launcher.additional_parameters.account to an account of yours",
    "InvalidQOS": "set hydra.launcher.additional_parameters.qos to a QOS of yours",
}


def never_clears(reason: str, prepare: bool = False) -> str:
    """The one line of a job SLURM would keep pending for ever: the reason, and the key to change."""
    resources = "prepare_cpus_per_task or prepare_mem_gb" if prepare else "cpus_per_task, mem_gb or gpus_per_node"
    hint = NEVER_CLEARS[reason].format(p="prepare_" if prepare else "", resources=resources)
    return f"SLURM keeps it pending for ever ({reason}): {hint}"


def queue(job_ids: list[str]) -> dict[str, tuple[str, str]] | None:
    """squeue's (state, reason) of each of these jobs it still knows; None when it cannot answer (slurmctld
    down)."""
    try:
        out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %T %r", f"--jobs={','.join(job_ids)}"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:     # it knows none of them, or cannot be asked
        return {} if "Invalid job id" in out.stderr else None
    rows = (line.split(maxsplit=2) for line in out.stdout.splitlines() if line.strip())
    return {row[0]: (row[1], row[2] if len(row) > 2 else "") for row in rows}


def ended(jobs: dict) -> dict[str, str]:
    """Of these submitit jobs (signature -> job), those out of the queue, or ended in it, without a result:
    signature -> their last state there ('' once it forgot them); none when squeue cannot answer."""
    return without_result(jobs, queue([job.job_id for job in jobs.values()]) if jobs else {})


def without_result(jobs: dict, states: dict | None) -> dict[str, str]:
    """`ended`, from squeue's answer (`queue`)."""
    if states is None:
        return {}
    return {signature: states.get(job.job_id, ("", ""))[0] for signature, job in jobs.items()
            if states.get(job.job_id, ("", ""))[0] in ENDED | {""} and not has_result(job)}


def stuck(jobs: dict, states: dict | None) -> dict[str, str]:
    """Of these submitit jobs, those pending for a reason that never clears: signature -> the reason."""
    return {signature: states[job.job_id][1] for signature, job in jobs.items()
            if states and states.get(job.job_id, ("", ""))[0] == "PENDING"
            and states[job.job_id][1] in NEVER_CLEARS}


def largest_node(partition: str | None) -> tuple[int, int] | None:
    """(CPUs, memory in MB) of the partition's largest node (the default partition's for None), as sinfo
    tells; None where it cannot (no sinfo, no cluster, a SLURM_CONF that is not there: sinfo would retry it 60 s)."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not os.path.exists(conf):
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%c %m %P", *(["-p", partition] if partition else [])],
                             capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line.split() for line in out.stdout.splitlines() if len(line.split()) == 3]
    nodes = [(int(c), int(m)) for c, m, p in rows if c.isdigit() and m.isdigit() and (partition or p.endswith("*"))]
    return max(nodes) if out.returncode == 0 and nodes else None


class LostJobs:
    """Which of a sweep's cluster jobs are lost: their status file unchanged for `after_s`, as this watch
    has seen it, and `ended`; or stuck: as silent, and pending for a reason that never clears. It looks every
    quarter of `after_s` (at most every 30 s), and asks the queue only about the silent ones, once for all."""

    def __init__(self, after_s: float):
        self.after_s, self.every_s, self.next_check = after_s, min(30.0, after_s / 4), 0.0
        self.heard: dict[str, tuple] = {}     # signature -> (its status file's `updated`, when first seen so)

    def check(self, jobs: dict) -> tuple[dict[str, str], dict[str, str]]:
        """The jobs (signature -> submitit job) lost by now (signature -> their last state in the queue), and
        those pending for a reason that never clears (signature -> the reason; `stuck`)."""
        now = time.monotonic()
        if now < self.next_check:
            return {}, {}
        self.next_check = now + self.every_s
        silent = {signature: job for signature, job in jobs.items() if self._silent_s(signature, now) >= self.after_s}
        states = queue([job.job_id for job in silent.values()]) if silent else {}
        return without_result(silent, states), stuck(silent, states)

    def _silent_s(self, signature: str, now: float) -> float:
        updated = status.read(paths.runs_dir() / signature).get("updated")
        heard = self.heard.get(signature)
        if heard is None or heard[0] != updated:
            self.heard[signature] = heard = (updated, now)
        return now - heard[1]
