"""The datasets a sweep's jobs read, prepared before any of them trains.

A job prepares its missing dataset itself (ddl.train), but in a sweep every job would then wait on one
lock, each holding its GPUs. So the sweep launcher looks first (a manifest under DDL_HOME/data, nothing
written) and prepares each missing dataset once: the local launcher here, on the machine's cores, before
it submits a job; the SLURM launcher as one CPU-only job per dataset (`hydra.launcher.prepare_*`), every
training job that reads it submitted with `--dependency=afterok` on it and `--kill-on-invalid-dep=yes`, so
that SLURM ends them if it fails even when no launcher is left to. A prepare job that fails, leaves the queue
without a result, or would pend for ever (more CPUs or memory than a node has: the job asks at most what the
partition's largest node has) fails its dependents with its one line; the sweep run again resumes the
preparation where it stopped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .. import paths
from ..locks import exclusive
from ..data import DataConfig
from ..text import plural
from .estimate import prepare_seconds
from .spec import Job

WAITING = "waiting on data"
PREPARE_KEYS = ("prepare_partition", "prepare_cpus_per_task", "prepare_mem_gb", "prepare_timeout_min")


@dataclass
class DataNeed:
    """A dataset that is not prepared, and the jobs that read it."""
    data: DataConfig
    jobs: list[Job] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.data.dataset_name()


def missing(jobs: list[Job]) -> list[DataNeed]:
    """The datasets of these jobs that are not prepared (no manifest yet), in the order the jobs need them."""
    needs: dict[str, DataNeed] = {}
    for job in jobs:
        name = job.run.data.dataset_name()
        if name in needs or not (paths.data_dir() / name / "manifest.json").is_file():
            needs.setdefault(name, DataNeed(job.run.data)).jobs.append(job)
    return list(needs.values())


def prepare_cpus(launcher) -> int:
    """The CPUs a preparation gets: the prepare job's on SLURM (`prepare_size`), this machine's (or allocation's)
    here."""
    if launcher._EXECUTOR == "slurm":
        return prepare_size(launcher)[0]
    from ..cpus import cpu_threads
    return cpu_threads()


def prepare_size(launcher) -> tuple[int, int | None, str]:
    """(CPUs, GB, a note) of the prepare job: hydra.launcher.prepare_cpus_per_task and prepare_mem_gb, each at
    most what the partition's largest node has (sinfo), so that the default (32 CPUs, 64 GB) is scheduled on a
    smaller node rather than kept pending for ever; the note says what was lowered."""
    from . import cluster
    params = launcher.params
    cpus, mem_gb = int(params.get("prepare_cpus_per_task") or 1), params.get("prepare_mem_gb")
    partition = params.get("prepare_partition") or params.get("partition")
    node = cluster.largest_node(partition)
    if node is None or (cpus <= node[0] and (mem_gb is None or mem_gb * 1024 <= node[1])):
        return cpus, mem_gb, ""
    fit_cpus, fit_gb = min(cpus, node[0]), mem_gb and min(mem_gb, node[1] // 1024)
    where = f"partition {partition}" if partition else "the default partition"
    return fit_cpus, fit_gb, (f"prepare_cpus_per_task={cpus}, prepare_mem_gb={mem_gb} lowered to {fit_cpus} CPUs, "
                              f"{fit_gb} GB: the largest node of {where}")


def estimate(need: DataNeed, cpus: int) -> tuple[float, float]:
    """(tokens, seconds) its preparation takes on `cpus` (ddl.launch.estimate); a source that cannot be listed
    (no file matches, a parquet footer damaged, no `text` column) is one line before anything is submitted."""
    from .configs import ConfigError
    try:
        return prepare_seconds(need.data, cpus)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _where(launcher, cpus: int, seconds: float) -> str:
    """Where a preparation runs and how long it takes: 'one CPU-only SLURM job, 32 CPUs: about 17 min'."""
    if launcher._EXECUTOR != "slurm":
        return f"{about(seconds)} on {plural(cpus, 'core')}"
    partition = launcher.params.get("prepare_partition")
    return (f"one CPU-only SLURM job, {plural(cpus, 'CPU')}" + (f", partition {partition}" if partition else "")
            + f": {about(seconds)}")


RATE = "at the tokens/s one worker was measured at (ddl/launch/estimate.py), times the workers"


def plan(needs: list[DataNeed], launcher) -> tuple[list[tuple[str, str, float]], str]:
    """A dry run's view of the preparations: on SLURM a row per prepare job (dataset, where and how long,
    tokens); the caption's sentence (here: what is prepared first, and how long it takes)."""
    if not needs:
        return [], ""
    if launcher._EXECUTOR != "slurm":
        return [], f"Data first, here: {_each(needs, launcher)} ({RATE})."
    cpus, _, lowered = prepare_size(launcher)
    rows = [(need.name, f"{_where(launcher, cpus, seconds)}; {plural(len(need.jobs), 'job')} wait on it", tokens)
            for need, (tokens, seconds) in ((need, estimate(need, cpus)) for need in needs)]
    return rows, (f"Data first: each prepare job runs before the jobs that read its dataset, which are submitted "
                  f"with --dependency=afterok on it and --kill-on-invalid-dep=yes (SLURM ends them if it fails) "
                  f"(its time {RATE})." + (f" The prepare job's {lowered}." if lowered else ""))


def search_sentence(needs: list[DataNeed], launcher) -> str:
    """A search's dry run: the datasets its first round prepares before its trials train, each with where and
    how long (on SLURM a prepare job, the trials submitted with --dependency=afterok on it)."""
    if not needs:
        return ""
    how = " (each by a prepare job, the trials submitted with --dependency=afterok on it)" \
        if launcher._EXECUTOR == "slurm" else ", here"
    return f"Data first, before the first round's trials{how}: {_each(needs, launcher)} ({RATE})."


def _each(needs: list[DataNeed], launcher) -> str:
    """Each dataset with its tokens, where it is prepared and how long it takes."""
    cpus = prepare_cpus(launcher)
    return "; ".join(f"{need.name} (~{tokens:.3g} tokens), {_where(launcher, cpus, seconds)}"
                     for need, (tokens, seconds) in ((need, estimate(need, cpus)) for need in needs))


def about(seconds: float) -> str:
    """An estimate's duration: 'under a minute', 'about 40 min', 'about 2.5 h'."""
    if seconds < 60:
        return "under a minute"
    return f"about {seconds / 60:.0f} min" if seconds < 5400 else f"about {seconds / 3600:.2g} h"


def prepare_here(needs: list[DataNeed]) -> None:
    """The local launcher's preparation, in its own process, before any job starts (its progress line shows);
    a source that cannot be read is one line (ConfigError), and leaves nothing."""
    from ..data import prepare
    from .configs import ConfigError
    for need in needs:
        print(f"ddl-run: preparing {need.name} for {plural(len(need.jobs), 'job')} before they train", flush=True)
        try:
            prepare(need.data)
        except ValueError as err:
            raise ConfigError(str(err)) from None


class PrepareTask:
    """What a prepare job runs: the dataset, prepared on the job's CPUs. A submitit Checkpointable: a job
    that times out is requeued, and its build resumes."""

    def __call__(self, data: dict, workers: int) -> str:
        from ..data import prepare
        return str(prepare(DataConfig(**data), workers=workers))

    def checkpoint(self, data: dict, workers: int):
        import submitit
        return submitit.helpers.DelayedSubmission(self, data, workers)


class PrepareJob:
    """A submitted prepare job, as the sweep sees it: running, done, or ended with an error line."""

    def __init__(self, need: DataNeed, handle):
        from . import cluster
        self.need, self.handle = need, handle
        self.error: str | None = None        # its one line, once it failed or was lost
        self.done = False
        self.every_s, self.next_check = min(30.0, cluster.lost_after_seconds() / 4), 0.0   # squeue's pace

    @property
    def job_id(self) -> str:
        return self.handle.job_id

    def dependency(self) -> dict:
        """The sbatch options of a job that reads this dataset: after this one succeeds, and ended by SLURM if it
        does not (the sweep's process may be gone by then); none once it is prepared (SLURM forgets an ended job
        after MinJobAge; afterok on a job it no longer knows is refused)."""
        return {} if self.done else {"dependency": f"afterok:{self.job_id}", "kill_on_invalid_dep": "yes"}

    def poll(self) -> bool:
        """Whether it ended, this call: prepared, failed (its error line) or lost (left the queue without a
        result)."""
        from . import cluster
        if self.done or self.error:
            return False
        if cluster.has_result(self.handle):
            failure = self.handle.exception()
            self.done, self.error = failure is None, failure and _error_line(failure)
            return True
        if time.monotonic() < self.next_check:
            return False
        self.next_check = time.monotonic() + self.every_s
        mine, states = {self.job_id: self.handle}, cluster.queue([self.job_id])
        gone, stuck = cluster.without_result(mine, states), cluster.stuck(mine, states)
        if gone:
            state = gone[self.job_id].lower().replace("_", " ") or "cancelled, or its node failed"
            self.error = (f"prepare job {self.job_id} of {self.need.name} left the queue without a result ({state}); "
                          f"run the sweep again to resume it")
        elif stuck:
            cancel([self.job_id])
            self.error = (f"prepare job {self.job_id} of {self.need.name} was cancelled: "
                          f"{cluster.never_clears(stuck[self.job_id], prepare=True)}")
        return bool(gone or stuck)


def _error_line(failure: BaseException) -> str:
    """The prepare's own one line, from submitit's error (the job's traceback between two rules)."""
    text = str(failure)
    trace = re.search(r"-{10,}\n(.*?)\n-{10,}", text, re.S)
    lines = [line.strip() for line in (trace.group(1) if trace else text).splitlines() if line.strip()]
    last = lines[-1] if lines else type(failure).__name__
    return re.sub(r"^(?:\w+\.)*(?:ValueError|ConfigError): ", "", last)


def submit(launcher, needs: list[DataNeed]) -> dict[str, PrepareJob]:
    """One CPU-only SLURM job per dataset (hydra.launcher.prepare_*), or the one another sweep on this DDL_HOME has
    queued for it: dataset name -> its PrepareJob."""
    executor = launcher.executor()
    params = launcher.params
    extra = {k: v for k, v in (params.get("additional_parameters") or {}).items()
             if k not in ("dependency", "kill_on_invalid_dep")}
    cpus, mem_gb, lowered = prepare_size(launcher)
    if lowered:
        print(f"ddl-run: the prepare job's {lowered}", flush=True)
    executor.update_parameters(
        name=f"{params.get('name') or 'ddl'}-prepare", cpus_per_task=cpus, gpus_per_node=0,
        tasks_per_node=1, nodes=1, timeout_min=params["prepare_timeout_min"], mem_gb=mem_gb,
        slurm_partition=params.get("prepare_partition") or params.get("partition"), slurm_gres=None,
        slurm_constraint=None, slurm_cpus_per_gpu=None, slurm_gpus_per_task=None, slurm_mem_per_gpu=None,
        slurm_additional_parameters=extra)
    jobs = {}
    for need in needs:
        with exclusive(paths.data_dir() / f"{need.name}.submit.lock"):   # one prepare job however many sweeps
            handle = _queued_elsewhere(need)
            if handle is None:
                tokens, seconds = estimate(need, cpus)
                handle = executor.submit(PrepareTask(), need.data.to_dict(), cpus)
                paths.write_atomic(_record(need), json.dumps({"job_id": handle.job_id,
                                                              "folder": str(handle.paths.folder)}))
                print(f"ddl-run: {need.name} is not prepared: SLURM job {handle.job_id} prepares it (~{tokens:.3g} "
                      f"tokens, {about(seconds)} on {plural(cpus, 'CPU')}); {plural(len(need.jobs), 'job')} wait on "
                      f"it", flush=True)
        jobs[need.name] = PrepareJob(need, handle)
    return jobs


def _record(need: DataNeed):
    """Which SLURM job prepares the dataset: the first sweep that submits one writes it, for the sweeps after."""
    return paths.data_dir() / f"{need.name}.prepare-job.json"


def _queued_elsewhere(need: DataNeed):
    """The prepare job another sweep on this DDL_HOME submitted for the dataset, while SLURM still runs or queues
    it (its submitit job, read from its folder), else None."""
    import submitit

    from . import cluster
    try:
        record = json.loads(_record(need).read_text())
        job_id, folder = str(record["job_id"]), record["folder"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    state = (cluster.queue([job_id]) or {}).get(job_id, ("", ""))[0]
    if not state or state in cluster.ENDED:
        return None
    print(f"ddl-run: {need.name} is not prepared: SLURM job {job_id}, which another sweep on this DDL_HOME "
          f"submitted, prepares it; {plural(len(need.jobs), 'job')} wait on it", flush=True)
    return submitit.SlurmJob(folder=folder, job_id=job_id)


def cancel(job_ids: list[str]) -> None:
    """scancel the jobs waiting on a dataset that will not come (their dependency can never be met; SLURM ends
    them too, by --kill-on-invalid-dep); a refusal is a warning line naming them."""
    _slurm(["scancel", *job_ids], job_ids, "SLURM ends them itself (--kill-on-invalid-dep=yes), or scancel them")


def release(job_ids: list[str]) -> None:
    """Their dataset is prepared: the jobs' dependency cleared, lest SLURM keep them pending for ever where the
    prepare job wrote its result yet ended otherwise than COMPLETED (cancelled as it finished). A job that
    started, or ended, already refuses the update, which changes nothing; any other refusal is a warning line."""
    _slurm(["scontrol", "update", f"JobId={','.join(job_ids)}", "Dependency="], job_ids,
           f"clear it by hand: scontrol update JobId={','.join(job_ids)} Dependency=",
           benign=("no longer pending", "already finished"))


def _slurm(command: list[str], job_ids: list[str], remedy: str, benign: tuple[str, ...] = ()) -> None:
    """Run a SLURM client on these jobs; one warning line where it fails for a reason not in `benign`."""
    if not job_ids:
        return
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60)
        said = [line for line in out.stderr.splitlines() if line.strip()]
        failed = out.returncode != 0 and not all(any(b in line for b in benign) for line in said)
    except (OSError, subprocess.TimeoutExpired) as err:
        said, failed = [str(err)], True
    if failed:
        print(f"ddl-run: warning: {command[0]} of job {', '.join(job_ids)} failed "
              f"({said[0].strip() if said else 'exit ' + str(out.returncode)}): {remedy}", file=sys.stderr, flush=True)


def report(prepare: PrepareJob) -> None:
    """The sweep's line when a prepare job ends."""
    if prepare.error:
        print(f"ddl-run: {prepare.need.name}: {prepare.error}", file=sys.stderr, flush=True)
    else:
        print(f"ddl-run: {prepare.need.name} prepared (SLURM job {prepare.job_id}); its jobs start", flush=True)
