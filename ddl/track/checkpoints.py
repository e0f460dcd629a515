"""Checkpoints as MLflow artifacts, so any home that reaches the store can evaluate or resume a run.

A run keeps one checkpoint artifact, `checkpoint/model.pt`, replaced by each upload (train.checkpoint_artifact:
`latest`, on every checkpoint; `final`, the last one only; `none`), with its step, size and sha256 as tags.
A download is verified against that sha256 before it lands among the run folder's checkpoints.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from . import store
from .journal import file_sha256

ARTIFACT_DIR, ARTIFACT_NAME = "checkpoint", "model.pt"
STEP_TAG, SHA_TAG, BYTES_TAG = "ddl.checkpoint_step", "ddl.checkpoint_sha256", "ddl.checkpoint_bytes"


class Uploader:
    """Uploads from a thread of its own, one at a time: training goes on meanwhile. A checkpoint written
    while the previous upload still runs waits for it; only the newest waiting one is uploaded."""

    def __init__(self, run):
        self.run = run
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ddl-upload")
        self._running: Future | None = None
        self._waiting: tuple[Path, int] | None = None

    def submit(self, path, step: int) -> None:
        self._waiting = (Path(path), step)
        if self._running is None or self._running.done():
            self._start()

    def _start(self) -> None:
        if self._running is not None:
            self._running.result()          # an upload that failed is reported here, by the next one
        path, step = self._waiting
        self._waiting = None
        self._running = self._pool.submit(upload, self.run, path, step)

    def wait(self, timeout: float) -> None:
        if self._waiting is not None:
            self._start()
        if self._running is not None:
            self._running.result(timeout=timeout)
        self._pool.shutdown()


def upload(run, path: Path, step: int) -> None:
    """The checkpoint as the run's `checkpoint/model.pt` (a hard link of that name beside it, so the file is
    not copied first), journaled with its sha256, then its tags."""
    staging = path.parent / f".upload-{os.getpid()}"
    staging.mkdir(exist_ok=True)
    link = staging / ARTIFACT_NAME
    link.unlink(missing_ok=True)
    try:
        os.link(path, link)
    except FileNotFoundError:               # pruned by a newer checkpoint before its turn came
        return
    try:
        digest, size = file_sha256(link), link.stat().st_size
        run.journal.append("artifact", run.id, path=f"{ARTIFACT_DIR}/{ARTIFACT_NAME}",
                           file=str(path.relative_to(run.run_dir)), sha256=digest, size=size)
        run.client.log_artifact(run.id, str(link), ARTIFACT_DIR)
        run.set_tags({STEP_TAG: step, SHA_TAG: digest, BYTES_TAG: size})
    finally:
        link.unlink(missing_ok=True)
        staging.rmdir()


def newest(signature: str):
    """The run of this signature holding the furthest-trained checkpoint artifact (any experiment, any
    home), or None."""
    runs = [r for r in store.runs_with_signature(signature) if SHA_TAG in r.data.tags]
    return max(runs, key=lambda r: (int(r.data.tags.get(STEP_TAG, 0)), r.info.status == "FINISHED"), default=None)


def fetch(signature: str, target_for: Callable[[int], Path]) -> Path | None:
    """Download the signature's newest checkpoint artifact to `target_for(step)`, verified by its sha256 (a
    mismatch is one line, and nothing lands). None when the store has none."""
    from .runs import _quiet_downloads
    run = newest(signature)
    if run is None:
        return None
    tags = run.data.tags
    target = target_for(int(tags[STEP_TAG]))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".download-{os.getpid()}"
    try:
        staging.mkdir(exist_ok=True)
        with _quiet_downloads():
            got = Path(store.client().download_artifacts(run.info.run_id, f"{ARTIFACT_DIR}/{ARTIFACT_NAME}",
                                                         str(staging)))
        if file_sha256(got) != tags[SHA_TAG]:
            raise ValueError(f"checkpoint artifact of MLflow run {run.info.run_id}: its sha256 does not match the "
                             f"run's {SHA_TAG} tag (damaged in the store or in transit); not used")
        os.replace(got, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"{signature}: checkpoint of step {tags[STEP_TAG]} downloaded from MLflow run {run.info.run_id} "
          f"({int(tags[BYTES_TAG]) / 1e6:.1f} MB, sha256 verified)", flush=True)
    return target
