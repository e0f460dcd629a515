"""A run folder's journal: every write a run makes to MLflow, appended as one checked JSON line.

`runs/<signature>/journal.jsonl` holds the whole history of the runs of that folder (a signature may
have several: a replaced run is `deleted` and a new one goes on), so the folder alone can rebuild
them in any store (`ddl.track.sync`). Pure Python: nothing here imports mlflow.

Each line is {"kind", "run", "t", <the kind's fields>, "sha"}: `run` is the run's uid (its MLflow
run id in the store that created it), `t` the time of the append in ms, `sha` the first 16 hex
digits of the sha256 of the canonical JSON (sorted keys, no spaces) of the rest. A line is written
with one write(2) on an O_APPEND descriptor, so two processes appending never interleave within a
line; `Journal.sync` makes it durable (after each checkpoint). A crash mid-append leaves a torn
last line, which reading ignores (`Journal.torn` says so); a later append then starts behind it on
the same line, and reading takes what follows the torn piece. Any other line that does not check is
damage.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

# The fields each record kind carries besides kind, run and t.
KINDS = {
    "run": ("experiment", "name", "start_time", "home"),
    "params": ("params",),
    "tags": ("tags",),
    "delete_tag": ("key",),
    "metrics": ("points",),
    "dataset": ("name", "digest", "source", "source_type", "profile", "context"),
    "artifact": ("path", "file", "sha256", "size"),
    "status": ("status", "end_time"),
    "deleted": (),
}
# Every record begins so (json escapes a quote inside a string value): where an append began behind a torn one.
RECORD_START = re.compile(rb'(?=\{"kind":)')


class JournalDamaged(ValueError):
    """A journal line that does not check: one line naming the file, the line number and what is wrong."""


@dataclass
class RunHistory:
    """One run as its journal records it, folded: the latest value of everything, each point once."""
    uid: str
    experiment: str | None = None
    name: str | None = None
    start_time: int | None = None
    params: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    points: list = field(default_factory=list)      # (key, value, timestamp_ms, step), in logged order
    datasets: list = field(default_factory=list)    # dicts of the dataset record's fields
    artifacts: dict = field(default_factory=dict)   # artifact path -> {"file", "sha256", "size"}
    status: str | None = None
    end_time: int | None = None
    deleted: bool = False


def _digest(record: dict) -> str:
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class Journal:
    FILE = "journal.jsonl"
    torn = False     # after records(): its last record was torn (a crash mid-append), and so ignored

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / self.FILE

    def append(self, kind: str, run: str, **fields) -> None:
        """Append one record (whole, with its checksum); creates the run folder if missing."""
        if kind not in KINDS:
            raise ValueError(f"journal record kind={kind!r}: must be one of {', '.join(KINDS)}")
        record = {"kind": kind, "run": run, "t": int(time.time() * 1000), **fields}
        line = json.dumps({**record, "sha": _digest(record)}, separators=(",", ":")).encode() + b"\n"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            written = os.write(fd, line)
        finally:
            os.close(fd)
        if written != len(line):   # a full disk: the torn line is the last one, and reading ignores it
            raise OSError(f"{self.path}: only {written} of {len(line)} bytes of a journal record written")

    def sync(self) -> None:
        """Make every record appended so far durable (fsync); nothing to do before the first."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def records(self) -> list[dict]:
        """Every record, checked; JournalDamaged names the first line that is neither whole nor torn."""
        self.torn = False
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        found = []
        for number, line in enumerate(lines, 1):
            pieces = [piece for piece in RECORD_START.split(line) if piece.strip()]
            for i, piece in enumerate(pieces):
                record, error = self._checked(piece)
                if record is not None:
                    found.append(record)
                elif i == len(pieces) - 1 and number < len(lines):   # neither torn nor followed by a record
                    raise JournalDamaged(f"{self.path}:{number}: {error}")
                self.torn = record is None       # the file's last piece decides
        return found

    @staticmethod
    def _checked(piece: bytes) -> tuple[dict | None, str | None]:
        """The record a line holds, or what is wrong with it."""
        try:
            record = json.loads(piece)
        except ValueError as err:
            return None, f"not a JSON record ({err})"
        if not isinstance(record, dict) or "sha" not in record:
            return None, "not a journal record (no checksum)"
        sha = record.pop("sha")
        if sha != _digest(record):
            return None, f"checksum {sha!r} does not match the line (changed after it was written)"
        kind = record.get("kind")
        missing = [key for key in ("run", "t", *KINDS.get(kind, ())) if key not in record]
        if kind not in KINDS or missing:
            return None, f"record kind={kind!r} " + (f"lacks {', '.join(missing)}" if missing else "is unknown")
        return record, None

    def runs(self) -> dict[str, RunHistory]:
        """The journal's runs by uid, in order of first appearance, each folded to its latest state."""
        histories: dict[str, RunHistory] = {}
        seen_points: dict[str, set] = {}
        for record in self.records():
            run = histories.setdefault(record["run"], RunHistory(record["run"]))
            _fold(run, record, seen_points.setdefault(run.uid, set()))
        return histories


def _fold(run: RunHistory, record: dict, seen_points: set) -> None:
    kind = record["kind"]
    if kind == "run":
        run.experiment, run.name, run.start_time = record["experiment"], record["name"], record["start_time"]
    elif kind == "params":
        run.params.update(record["params"])
    elif kind == "tags":
        run.tags.update(record["tags"])
    elif kind == "delete_tag":
        run.tags.pop(record["key"], None)
    elif kind == "metrics":
        for key, value, timestamp, step in record["points"]:
            point = (key, value, timestamp, step)
            seen = (key, "nan" if math.isnan(value) else value, timestamp, step)
            if seen not in seen_points:
                seen_points.add(seen)
                run.points.append(point)
    elif kind == "dataset":
        dataset = {key: record[key] for key in KINDS["dataset"]}
        if dataset not in run.datasets:
            run.datasets.append(dataset)
    elif kind == "artifact":
        run.artifacts[record["path"]] = {key: record[key] for key in ("file", "sha256", "size")}
    elif kind == "status":
        run.status, run.end_time = record["status"], record["end_time"]
    elif kind == "deleted":
        run.deleted = True


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (an artifact record's `sha256`), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
