"""Per-job status files (DDL_HOME/runs/<signature>/status.json) that the sweep's live table polls.

Written atomically by the job's rank 0; readable the same way on a laptop or a shared cluster disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from .. import paths

FILE = "status.json"
LOCK = "lock"
DECISION = "decision"     # decision.<job>: rank 0's word to the other ranks of a multi-task job
ELSEWHERE = "running elsewhere"
REUSED = "reused"     # finished in another experiment: its run copied, nothing trained
LOST = "lost"         # a cluster job that left the queue without a result (ddl.launch.cluster)


def reused(source: str) -> str:
    return f"{REUSED} (from experiment {source})"


class RunningElsewhere(RuntimeError):
    """Another process holds the signature's lock: it is training (or evaluating) this run now."""


@contextlib.contextmanager
def claim(run_dir: Path):
    """Hold runs/<sig>/lock while this process works on the run: an flock, which the OS releases when
    the holder exits or dies (SIGKILL included), as a SLURM job's claim ends with the job.
    RunningElsewhere names the holder when another process has it. A folder this claim created and
    nothing else wrote to (the job stopped at a one-line error) goes with it, and so does runs/ when
    that leaves it empty."""
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with _locked(run_dir) as handle:
            yield handle
    finally:
        if created and os.listdir(run_dir) == [LOCK]:
            (run_dir / LOCK).unlink()
            run_dir.rmdir()
            paths.prune(run_dir.parent)


@contextlib.contextmanager
def _locked(run_dir: Path):
    with open(run_dir / LOCK, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise RunningElsewhere(f"{ELSEWHERE}: {handle.read().strip() or 'another process'}") from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        yield handle


def holder(run_dir: Path) -> str | None:
    """Who holds the run's lock now ("pid N on host"), or None when no one does."""
    if not (run_dir / LOCK).is_file():
        return None
    try:
        with _locked(run_dir):
            return None
    except RunningElsewhere as err:
        return str(err).removeprefix(f"{ELSEWHERE}: ")


def write(run_dir: Path, **fields) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    current = read(run_dir)
    current.update(fields, updated=time.time())
    paths.write_atomic(run_dir / FILE, json.dumps(current))


def read(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / FILE).read_text())
    except (FileNotFoundError, ValueError):   # not there yet, or garbled (bad JSON, bad UTF-8): a new one replaces it
        return {}


def finished_in(run_dir: Path, signature: str, experiment: str, evaluations=(), rebuild: bool = True,
                lookup=None):
    """The signature's FINISHED run in this experiment with these evaluations ('task@shots'), as the store
    holds it (store.Stored, asked through `lookup`, a store.Lookup, where given), whichever home trained it; else
    None (the job runs, and adds what is missing). A store that lost the run (emptied, replaced) gets it back from
    the run folder's journal (`rebuild`; a dry run only looks)."""
    from ..track import runs, store
    found = store.finished(signature, experiment, evaluations, lookup)
    if found is None and runs.journal_holds_finished(run_dir, experiment, evaluations):
        if not rebuild:
            return store.Stored("(in its run folder's journal)", experiment, {}, None)
        runs.rebuild(run_dir, experiment)
        found = store.finished(signature, experiment, evaluations)
    return found


def announce(run_dir: Path, job_key: str | None, decision: str) -> None:
    """Rank 0's decision for the other ranks of its job (key None: it has none): `train`, or why it leaves
    the signature."""
    if job_key is not None:
        paths.write_atomic(run_dir / f"{DECISION}.{job_key}", decision)


def await_decision(run_dir: Path, job_key: str, timeout_s: float = 900) -> str:
    """The other ranks wait for rank 0's decision (it may leave a signature claimed elsewhere, and they
    must leave with it rather than wait for it in the process group)."""
    path, deadline = run_dir / f"{DECISION}.{job_key}", time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 of job {job_key} decided nothing about {run_dir.name} in {timeout_s:.0f} s")
        time.sleep(0.5)
    return path.read_text()


class Progress:
    """A run's progress from the metrics its trainer logs: step, last losses, tokens/s and ETA (the
    status file's fields, and what the console's progress line shows)."""
    SHOWN = (("train/loss", "train_loss"), ("val/loss", "val_loss"), ("train/tokens_per_s", "tokens_per_s"))

    def __init__(self, total_steps: int):
        self.total, self.started, self.first_step = total_steps, time.time(), None
        self.fields: dict = {}

    def update(self, metrics: dict[str, float], step: int) -> dict:
        if self.first_step is None:
            self.first_step, self.started = step, time.time()
            eta = None
        else:
            rate = (step - self.first_step) / max(time.time() - self.started, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else None
        self.fields.update(step=step, steps=self.total, eta_s=eta)
        self.fields.update({name: metrics[key] for key, name in self.SHOWN if key in metrics})
        return self.fields


class StatusLogger:
    """MetricLogger that keeps status.json current: step, losses, tokens/s, ETA."""

    def __init__(self, run_dir: Path, total_steps: int):
        self.run_dir, self.progress = run_dir, Progress(total_steps)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        write(self.run_dir, **self.progress.update(metrics, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
