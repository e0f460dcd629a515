"""Per-job status files (DDL_HOME/runs/<signature>/status.json) that the sweep's live table polls.

Written atomically by the job's rank 0; readable the same way on a laptop or a shared cluster disk.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import paths

FILE = "status.json"
DONE = "done.json"


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


def finished_in(run_dir: Path, experiment: str, evaluations: list[str] = ()) -> dict | None:
    """The done marker's entry for this experiment, if the job finished there with these
    evaluations ('task@shots') among its own; else None (the job runs, and adds what is missing)."""
    try:
        entry = json.loads((run_dir / DONE).read_text()).get(experiment)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return entry if entry is not None and set(evaluations) <= set(entry.get("evaluations", [])) else None


def mark_done(run_dir: Path, experiment: str, entry: dict) -> None:
    try:
        done = json.loads((run_dir / DONE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        done = {}
    done[experiment] = entry
    paths.write_atomic(run_dir / DONE, json.dumps(done, indent=1))


class StatusLogger:
    """MetricLogger that keeps status.json current: step, losses, tokens/s, ETA."""

    def __init__(self, run_dir: Path, total_steps: int):
        self.run_dir, self.total = run_dir, total_steps
        self.started, self.first_step = time.time(), None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.first_step is None:
            self.first_step, self.started = step, time.time()
            eta = None
        else:
            rate = (step - self.first_step) / max(time.time() - self.started, 1e-9)
            eta = (self.total - step) / rate if rate > 0 else None
        fields = {"step": step, "steps": self.total, "eta_s": eta}
        for key, name in (("train/loss", "train_loss"), ("val/loss", "val_loss"), ("train/tokens_per_s", "tokens_per_s")):
            if key in metrics:
                fields[name] = metrics[key]
        write(self.run_dir, **fields)

    def close(self) -> None:
        pass
