"""The trainer's MLflow logger: every point goes to the run's journal at once and to MLflow in batches,
from a worker thread, so training never waits for the store, and a store that is down for a while (a
team server restarted) loses nothing: the batch that failed is sent again, as it was, when the store
answers. MLflow keeps a metric point once however often it is sent (its key, value, timestamp and step
are the row's identity), so a batch sent twice is stored once. The run's heartbeat tag rides along.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from .. import paths
from . import checkpoints, mlflow_private, store
from .journal import Journal
from .runs import TrackedRun

PATIENCE_ENV = "DDL_STORE_PATIENCE_S"     # how long a checkpoint or the run's end waits for a store that is down
DEFAULT_PATIENCE_S = 600
SLOW_S = 15           # a batch unanswered this long (MLflow retrying a server that is down) counts as an outage


class StoreUnreachable(RuntimeError):
    """The store stayed down past the patience: one line naming it; the checkpoint on disk is intact."""


def patience_s() -> float:
    value = os.environ.get(PATIENCE_ENV, str(DEFAULT_PATIENCE_S))
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{PATIENCE_ENV}={value}: must be a number of seconds >= 0")
    return seconds


class MLflowLogger:
    """MetricLogger for one TrackedRun. `note(text)` hears of an outage and of its end (the job's status
    file, which the sweep's table shows). `upload` is train.checkpoint_artifact: latest | final | none."""

    def __init__(self, run: TrackedRun, *, upload: str = "latest", total_steps: int = 0,
                 note: Callable[[str], None] = lambda text: None, flush_s: float = 5.0, max_buffer: int = 900):
        self.run, self.upload, self.total_steps, self.note = run, upload, total_steps, note
        self.flush_s, self.max_buffer, self.patience = flush_s, max_buffer, patience_s()
        self._pending: list = []                          # points not yet handed to the worker
        self._sending: tuple[Future, list, float] | None = None  # the batch in flight, since when
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="ddl-mlflow")
        self._uploads = checkpoints.Uploader(run)
        self._last_hand_over = self._last_beat = time.monotonic()
        self.down_since: float | None = None
        self.outages: list[float] = []                    # seconds each outage lasted
        self.gave_up = False                              # the store stayed down past the patience
        self._system_points: list = []                   # MLflow's system metrics, from its monitor's thread
        self._system_lock = threading.Lock()
        self._system = mlflow_private.system_metrics_monitor(run.id, paths.tracking_uri(),
                                                             self._take_system_metrics)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._pending.extend(self._journaled(metrics, step))
        with self._system_lock:
            self._pending.extend(self._system_points)
            self._system_points = []
        if len(self._pending) >= self.max_buffer or time.monotonic() - self._last_hand_over > self.flush_s:
            self._hand_over(block=False)

    def _journaled(self, metrics: dict[str, float], step: int) -> list:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        points = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.run.journal_points(points)
        return points

    def _take_system_metrics(self, metrics: dict[str, float], step: int) -> None:
        """MLflow's system metrics go the way of the training metrics: journaled, then in our batches."""
        points = self._journaled(metrics, step)
        with self._system_lock:
            self._system_points.extend(points)

    def checkpoint_saved(self, path, step: int) -> None:
        """A checkpoint was written: the journal syncs with it, and the policy decides whether it is uploaded."""
        self.run.journal.sync()
        if self.upload == "latest" or (self.upload == "final" and step >= self.total_steps):
            self._uploads.submit(path, step)

    def _hand_over(self, block: bool) -> None:
        if self._sending is not None:
            if not block and not self._sending[0].done():
                if time.monotonic() - self._sending[2] > SLOW_S:
                    self._down(f"not answering for {SLOW_S} s")
                return                                    # the store is slow or down: keep buffering
            self._collect()
        beat = time.monotonic() - self._last_beat > store.HEARTBEAT_S
        if self._pending or beat:
            batch, self._pending = self._pending, []
            self._sending = (self._worker.submit(self._send, batch, beat), batch, time.monotonic())
            self._last_hand_over = time.monotonic()

    def _send(self, batch: list, beat: bool) -> float:
        """Deliver a batch (and the heartbeat when due); returns when the store answered."""
        from mlflow.entities import RunTag
        tags = [RunTag(store.HEARTBEAT_TAG, str(int(time.time())))] if beat else []
        for i in range(0, max(len(batch), 1), 1000):
            self.run.client.log_batch(self.run.id, metrics=batch[i:i + 1000], tags=tags if i == 0 else [])
        if beat:
            self._last_beat = time.monotonic()
        return time.monotonic()

    def _collect(self) -> bool:
        """Wait for the batch in flight; a failed one goes back to the front of the queue."""
        future, batch, sent = self._sending
        self._sending = None
        try:
            answered = future.result()
        except Exception as err:
            self._pending[:0] = batch
            self._down(type(err).__name__)
            return False
        # the store's own time to answer, not the training loop's to come back (a validation in between)
        if self.down_since is None and answered - sent > SLOW_S:       # MLflow's own retries carried it
            self.down_since = sent
        if self.down_since is not None:
            self.outages.append(answered - self.down_since)
            self.down_since = None
            self.note(f"MLflow was unreachable for {self.outages[-1]:.0f} s; every point delivered since")
        return True

    def _down(self, why: str) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.note(f"MLflow unreachable ({why}); buffering {len(self._pending)} points")

    def flush(self) -> None:
        """Every metric logged so far is in the store when this returns (a store down for longer than the
        patience: StoreUnreachable)."""
        deadline = time.monotonic() + self.patience
        while True:
            self._hand_over(block=True)
            delivered = self._collect() if self._sending is not None else True
            if delivered and not self._pending:
                return
            if time.monotonic() > deadline:
                self.gave_up = True
                raise StoreUnreachable(f"MLFLOW_TRACKING_URI={store.redacted(paths.tracking_uri())}: unreachable for "
                                       f"over {self.patience:.0f} s ({PATIENCE_ENV}); its {len(self._pending)} points "
                                       f"are in {self.run.run_dir / Journal.FILE}; the checkpoints are intact")
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        if self._system is not None:
            self._system.finish()
            samples = self._system.aggregate_metrics()   # taken since it last logged: all of a short run's
            if samples:
                self._system.publish_metrics(samples)
            self._system = None
        with self._system_lock:
            self._pending.extend(self._system_points)
            self._system_points = []
        if not self.gave_up:
            self.flush()
            self._uploads.wait(self.patience)
        self._worker.shutdown(wait=not self.gave_up)
