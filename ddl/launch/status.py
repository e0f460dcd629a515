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
DONE = "done.json"
LOCK = "lock"
ELSEWHERE = "running elsewhere"
REUSED = "reused"     # finished in another experiment: its run copied, nothing trained


def reused(source: str) -> str:
    return f"{REUSED} (from experiment {source})"


class RunningElsewhere(RuntimeError):
    """Another process holds the signature's lock: it is training (or evaluating) this run now."""


@contextlib.contextmanager
def claim(run_dir: Path):
    """Hold runs/<sig>/lock while this process works on the run: an flock, which the OS releases when
    the holder exits or dies (SIGKILL included), as a SLURM job's claim ends with the job.
    RunningElsewhere names the holder when another process has it. A folder this claim created and
    nothing else wrote to (the job stopped at a one-line error) goes with it."""
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        with _locked(run_dir) as handle:
            yield handle
    finally:
        if created and os.listdir(run_dir) == [LOCK]:
            (run_dir / LOCK).unlink()
            run_dir.rmdir()


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
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _done(run_dir: Path) -> dict:
    """done.json: experiment -> its entry ({run_id, final, evaluations[, reused_from]})."""
    try:
        return json.loads((run_dir / DONE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _covers(entry: dict, evaluations) -> bool:
    return set(evaluations) <= set(entry.get("evaluations", []))


def finished_in(run_dir: Path, experiment: str, evaluations: list[str] = ()) -> dict | None:
    """The done marker's entry for this experiment, if the job finished there with these
    evaluations ('task@shots') among its own and the tracking store holds its run FINISHED; else
    None (the job runs, and adds what is missing; a marker the store disagrees with is reported)."""
    entry = _done(run_dir).get(experiment)
    if entry is None or not _covers(entry, evaluations):
        return None
    from ..track import store
    if not store.holds_finished(entry["run_id"], experiment):
        print(f"{run_dir.name}: {DONE} says finished in '{experiment}' as MLflow run {entry['run_id']}, but the "
              f"store ({paths.tracking_uri()}) does not hold that run FINISHED; running the job again", flush=True)
        return None
    return entry


def finished_elsewhere(run_dir: Path, experiment: str, evaluations: list[str] = ()) -> tuple[str, dict] | None:
    """(another experiment, its entry) where this signature finished with these evaluations and the
    store holds its run FINISHED: the job's run there can be reused here without training or
    evaluating. An experiment that trained the run is preferred to one that reused it."""
    from ..track import store
    entries = sorted(_done(run_dir).items(), key=lambda item: "reused_from" in item[1])
    return next(((other, entry) for other, entry in entries if other != experiment and _covers(entry, evaluations)
                 and store.holds_finished(entry["run_id"], other)), None)


def mark_done(run_dir: Path, experiment: str, entry: dict) -> None:
    done = _done(run_dir)
    done[experiment] = entry
    paths.write_atomic(run_dir / DONE, json.dumps(done, indent=1))


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
