"""The narrow metric-logger interface the trainer writes to (MLflow's lives in ddl/track)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol


class MetricLogger(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def flush(self) -> None: ...   # what was logged is stored when this returns (called before each checkpoint)
    def close(self) -> None: ...
    # Optional: `checkpoint_saved(path, step)`, told of each checkpoint written (rank 0; MultiLogger passes it on).


class ConsoleLogger:
    """One line per log step, to stdout or a file (the run log)."""
    KEYS = ("train/loss", "val/loss", "val/bpb", "train/lr", "train/tokens_per_s", "beta/mean", "beta/frac_gt1")

    def __init__(self, stream=None):
        self.stream = stream

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        shown = "  ".join(f"{k}={metrics[k]:.4g}" for k in self.KEYS if k in metrics)
        print(f"step {step:>6}  {shown}", file=self.stream, flush=True)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlLogger:
    def __init__(self, path: Path):
        self._file = open(path, "a", encoding="utf-8")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._file.close()


class MultiLogger:
    def __init__(self, *loggers: MetricLogger):
        self.loggers = loggers

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step)

    def flush(self) -> None:
        for logger in self.loggers:
            logger.flush()

    def checkpoint_saved(self, path: Path, step: int) -> None:
        for logger in self.loggers:
            if hasattr(logger, "checkpoint_saved"):
                logger.checkpoint_saved(path, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
