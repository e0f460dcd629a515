"""`ddl-track sync [--to URI]`: rebuild a store from the run folders' journals (`ddl.track.journal`).

Every `DDL_HOME/runs/*/journal.jsonl` goes into the target store (default: the current one). A
journal's run is found there by its uid (the store that created it still holds it) or by the tag
`ddl.origin` (a run an earlier sync created); then only what the target lacks is added. A target run
with other numbers (a param, or a point of the same key and step, of another value) is a conflict:
one line naming both runs, and that run is left as it is. A run the target lacks is created with
everything the journal holds. A second sync adds nothing. A run that neither the journal nor the
target holds an end for (its job runs now or was stopped; the journal's last record is torn) stays
RUNNING there: one line says which, why and what will end it, and the summary counts it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
import sys
import tempfile
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .. import paths
from ..text import plural
from ..validation import OneLineParser
from .journal import Journal, JournalDamaged, RunHistory, file_sha256

ORIGIN_TAG = "ddl.origin"          # on a run a sync created: the uid of the journal's run it rebuilds
CONTEXT_TAG = "mlflow.data.context"
TERMINAL = ("FINISHED", "FAILED", "KILLED")
PARAMS_PER_CALL, TAGS_PER_CALL, METRICS_PER_CALL = 100, 100, 1000   # MLflow's log_batch limits
MAX_FLOAT = sys.float_info.max     # what MLflow stores for an infinite metric value


class Outcome(NamedTuple):
    """What syncing one run did: state is created, updated, up to date, conflict, skipped (deleted) or failed."""
    state: str
    run_id: str | None = None
    points: int = 0
    artifacts: int = 0
    problems: tuple[str, ...] = ()    # one line each: the conflict, an artifact that could not be uploaded
    running: bool = False             # left RUNNING in the target: neither it nor the journal holds the run's end


@dataclass
class SyncReport:
    target: str                        # the target URI, fit to print
    journals: int = 0
    states: Counter = field(default_factory=Counter)
    points: int = 0
    artifacts: int = 0
    problems: list[str] = field(default_factory=list)
    running: list[str] = field(default_factory=list)   # one line per run left RUNNING: why, and what ends it

    def add(self, outcome: Outcome) -> None:
        self.states[outcome.state] += 1
        self.points += outcome.points
        self.artifacts += outcome.artifacts
        self.problems.extend(outcome.problems)

    def summary(self) -> str:
        s = self.states
        added = (f"{plural(self.points, 'point')} and {plural(self.artifacts, 'artifact')} added"
                 if self.points or self.artifacts else "nothing added")
        skipped = "".join(f", {s[state]} {state}" for state in ("skipped", "failed") if s[state])
        running = f"; {plural(len(self.running), 'run')} left RUNNING" if self.running else ""
        return (f"{plural(self.journals, 'journal')} into {self.target}: {plural(s['created'], 'run')} created, "
                f"{s['updated']} updated, {s['up to date']} up to date, {plural(s['conflict'], 'conflict')}"
                f"{skipped}; {added}{running}")


class _Held(NamedTuple):
    """What the target holds of a run, in the journal's terms."""
    params: dict
    tags: dict
    points: set                         # (key, step, timestamp, value) with values as MLflow stores them
    values: dict                        # (key, step) -> the set of values there
    datasets: set                       # (name, digest, context)
    artifacts: dict                     # artifact path -> size
    status: str | None
    end_time: int | None


NOTHING = _Held({}, {}, set(), {}, set(), {}, None, None)


def _stored(value: float) -> float | str:
    """A metric value as the target gives it back: NaN as a string (so points compare), inf as MLflow's max."""
    if math.isnan(value):
        return "nan"
    return math.copysign(MAX_FLOAT, value) if math.isinf(value) else value


def sync_home(runs_root: Path, target_uri: str) -> SyncReport:
    """Every run folder's journal (`runs_root/*/journal.jsonl`) into the target store; a damaged journal,
    a conflict or an artifact that cannot be uploaded is a line in the report, and the rest goes on.
    Without journals, no store is opened (or created)."""
    from . import store
    report = SyncReport(store.redacted(target_uri))
    journals = sorted(Path(runs_root).glob(f"*/{Journal.FILE}"),      # a search's parent before its children
                      key=lambda path: (not path.parent.name.startswith(store.SEARCH_FOLDER_PREFIX), path))
    report.journals = len(journals)
    if not journals:
        return report
    with _store_at(target_uri):
        client = store.client()
        for path in journals:
            journal = Journal(path.parent)
            try:
                histories = journal.runs()
            except JournalDamaged as err:
                report.problems.append(f"{err}; its runs are not synced")
                continue
            for history in histories.values():
                outcome = _sync_or_say(history, path.parent, client)
                report.add(outcome)
                if outcome.running:
                    report.running.append(_left_running(history, journal, outcome.run_id))
    return report


def _left_running(history: RunHistory, journal: Journal, run_id: str) -> str:
    """Which run a sync leaves RUNNING, why, and what will end it."""
    why = ("the journal's last record is torn (a crash mid-write), the run's end with it if it had one; running "
           "its job again resumes and ends it" if journal.torn else
           "its journal holds no end: its job ends it, or, if it was stopped, running it again resumes and ends it")
    return f"{history.name} [{journal.run_dir.name}]: MLflow run {run_id} stays RUNNING: {why}"


@contextlib.contextmanager
def _store_at(uri: str):
    """store.client() and store.experiment_id() reach the target while syncing."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before


def _sync_or_say(history: RunHistory, run_dir: Path, client) -> Outcome:
    """sync_run, with what the target refuses (a deleted experiment, a failed upload) as one line."""
    from mlflow.exceptions import MlflowException
    try:
        return sync_run(history, run_dir, client)
    except (MlflowException, OSError, ValueError) as err:
        detail = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        return Outcome("failed", problems=(f"{_where(run_dir, history)}: not synced: {detail}",))


def _where(run_dir: Path, history: RunHistory) -> str:
    return f"{Path(run_dir) / Journal.FILE} run {history.uid}"


def sync_run(history: RunHistory, run_dir: Path, client) -> Outcome:
    """One journal run into the client's store, which must be `store.client()`'s (a run it lacks is created
    in its experiment through `store.experiment_id`). Cheap when nothing is missing: a get_run, a metric
    history per key, an artifact listing per folder."""
    if history.deleted:
        return Outcome("skipped")
    history = _with_parent_here(history, client)
    run = _find(history, client)
    if run is None:
        return _create(history, run_dir, client)
    run_id = run.info.run_id
    if run.info.lifecycle_stage == "deleted":     # deleted in the target on purpose: not brought back
        return Outcome("skipped", run_id)
    held = _held(history, run, client)
    conflict = _conflict(history, held)
    if conflict:
        from .store import redacted
        return Outcome("conflict", run_id, problems=(
            f"conflict: {_where(run_dir, history)} and {redacted(client.tracking_uri)} run {run_id}: {conflict}; "
            f"that run is left as it is",))
    missing = _missing(history, held)
    if not any(missing):
        return Outcome("up to date", run_id, running=_unended(history, held))
    artifacts, problems = _write(history, run_dir, client, run_id, missing)
    return Outcome("updated", run_id, len(missing.points), artifacts, problems, _unended(history, held))


def _with_parent_here(history: RunHistory, client) -> RunHistory:
    """A search's child run names its parent by the parent's run id where it was made (MLflow's
    `mlflow.parentRunId`): in a store where the parent was synced under another id, that one."""
    from . import store
    parent = history.tags.get(store.PARENT_TAG)
    if not parent:
        return history
    found = _find(RunHistory(parent, history.experiment), client)
    if found is None or found.info.run_id == parent:
        return history
    return dataclasses.replace(history, tags={**history.tags, store.PARENT_TAG: found.info.run_id})


def _find(history: RunHistory, client):
    """The target's run of this journal run: by its uid, else by the origin tag of an earlier sync; or None."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException
    try:
        return client.get_run(history.uid)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    experiment = client.get_experiment_by_name(history.experiment) if history.experiment else None
    if experiment is None:
        return None
    found = client.search_runs([experiment.experiment_id], f"tags.`{ORIGIN_TAG}` = '{history.uid}'",
                               run_view_type=ViewType.ALL, max_results=1)
    return found[0] if found else None


def _create(history: RunHistory, run_dir: Path, client) -> Outcome:
    """A run the target lacks, with everything the journal holds; tagged with its origin first, so a sync
    cut short is completed by the next one."""
    from . import store
    if history.experiment is None:
        return Outcome("failed", problems=(f"{_where(run_dir, history)}: not synced: the journal has no `run` "
                                           f"record (its experiment and name)",))
    run = client.create_run(store.experiment_id(history.experiment), start_time=history.start_time,
                            run_name=history.name, tags={ORIGIN_TAG: history.uid})
    missing = _missing(history, NOTHING)
    artifacts, problems = _write(history, run_dir, client, run.info.run_id, missing)
    return Outcome("created", run.info.run_id, len(missing.points), artifacts, problems, _unended(history, NOTHING))


def _held(history: RunHistory, run, client) -> _Held:
    """What the target run holds of what the journal names: its params and tags, the points of the journal's
    metric keys, its datasets, the sizes of the artifacts in the journal's artifact folders."""
    run_id = run.info.run_id
    points, values = set(), {}
    for key in {point[0] for point in history.points} & set(run.data.metrics):
        for m in client.get_metric_history(run_id, key):
            points.add((key, m.step, m.timestamp, _stored(m.value)))
            values.setdefault((key, m.step), set()).add(_stored(m.value))
    datasets = {(d.dataset.name, d.dataset.digest, next((t.value for t in d.tags if t.key == CONTEXT_TAG), None))
                for d in (run.inputs.dataset_inputs if run.inputs else [])}
    artifacts = {item.path: item.file_size
                 for folder in {os.path.dirname(path) for path in history.artifacts}
                 for item in client.list_artifacts(run_id, folder or None) if not item.is_dir}
    return _Held(run.data.params, run.data.tags, points, values, datasets, artifacts, run.info.status,
                 run.info.end_time)


def _unended(history: RunHistory, held: _Held) -> bool:
    """Neither the journal nor the target holds the run's end: the sync leaves it RUNNING there."""
    return history.status not in TERMINAL and held.status not in TERMINAL


def _conflict(history: RunHistory, held: _Held) -> str | None:
    """What the target holds with other numbers than the journal (a param, a point of a key and step), or None."""
    for key, value in history.params.items():
        if held.params.get(key, value) != value:
            return f"param {key} is {value!r} in the journal, {held.params[key]!r} there"
    ours: dict = {}
    for key, value, _, step in history.points:
        ours.setdefault((key, step), set()).add(_stored(value))
    for (key, step), there in held.values.items():
        other = there - ours.get((key, step), there)
        if other:
            return (f"metric {key} at step {step} is {min(ours[key, step], key=str)} in the journal, "
                    f"{min(other, key=str)} there")
    return None


class _Missing(NamedTuple):
    """What the journal holds and the target lacks."""
    params: dict
    tags: dict
    points: list
    datasets: list
    artifacts: dict
    status: tuple | None              # (status, end_time) to set


def _missing(history: RunHistory, held: _Held) -> _Missing:
    ended = (history.status, history.end_time)
    return _Missing(
        params={k: v for k, v in history.params.items() if k not in held.params},
        tags={k: v for k, v in history.tags.items() if held.tags.get(k) != v},
        points=[p for p in history.points if (p[0], p[3], p[2], _stored(p[1])) not in held.points],
        datasets=[d for d in history.datasets if (d["name"], d["digest"], d["context"]) not in held.datasets],
        artifacts={path: a for path, a in history.artifacts.items() if held.artifacts.get(path) != a["size"]},
        status=ended if history.status in TERMINAL and ended != (held.status, held.end_time) else None)


def _write(history: RunHistory, run_dir: Path, client, run_id: str, missing: _Missing) -> tuple[int, tuple]:
    """Log what is missing (the run's status last); returns the artifacts uploaded and the problem lines."""
    from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
    batches = ([("params", [Param(k, v) for k, v in missing.params.items()], PARAMS_PER_CALL),
                ("tags", [RunTag(k, v) for k, v in missing.tags.items()], TAGS_PER_CALL),
                ("metrics", [Metric(k, v, t, s) for k, v, t, s in missing.points], METRICS_PER_CALL)])
    for name, items, size in batches:
        for i in range(0, len(items), size):
            client.log_batch(run_id, **{name: items[i:i + size]})
    if missing.datasets:
        client.log_inputs(run_id, datasets=[
            DatasetInput(Dataset(d["name"], d["digest"], d["source_type"], d["source"], profile=d["profile"]),
                         tags=[InputTag(CONTEXT_TAG, d["context"])]) for d in missing.datasets])
    uploaded, problems = 0, []
    for path, artifact in missing.artifacts.items():
        problem = _upload(client, run_id, Path(run_dir), path, artifact)
        if problem:
            problems.append(f"{_where(run_dir, history)}: artifact {path}: {problem}; not uploaded")
        uploaded += problem is None
    if missing.status:
        client.set_terminated(run_id, *missing.status)
    return uploaded, tuple(problems)


def _upload(client, run_id: str, run_dir: Path, path: str, artifact: dict) -> str | None:
    """The artifact from its local copy, checked against the journal's sha256; what is wrong, or None."""
    local = run_dir / artifact["file"]
    if not local.is_file():
        return f"its local copy {local} is gone"
    if file_sha256(local) != artifact["sha256"]:
        return f"its local copy {local} has changed since it was logged (sha256 differs)"
    folder, name = os.path.split(path)
    with tempfile.TemporaryDirectory() as tmp:
        named = local
        if local.name != name:                  # uploaded under the artifact's own name
            named = Path(tmp) / name
            named.symlink_to(local.resolve())
        client.log_artifact(run_id, str(named), folder or None)
    return None


URI_SCHEMES = ("sqlite:///", "http://", "https://", "postgresql", "mysql", "mssql")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="ddl-track", description="MLflow stores and the run folders' journals.")
    commands = parser.add_subparsers(dest="command", required=True)
    sync = commands.add_parser("sync", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                               help="rebuild a store from DDL_HOME's run folders")
    sync.add_argument("--to", metavar="URI", help="the target store (default: the current one, "
                      "MLFLOW_TRACKING_URI or DDL_HOME's mlflow.db)")
    args = parser.parse_args(argv)
    target = paths.tracking_uri() if args.to is None else args.to
    if not target.startswith(URI_SCHEMES) or not target.isprintable():
        what = "not an MLflow tracking URI" if target.isprintable() else "a control character (a newline?) in it"
        print(f"ddl-track: error: --to={scrub(target, target)!r}: {what}; allowed: "
              f"sqlite:///<path>, http(s)://<host>:<port>, postgresql://, mysql:// or mssql:// URIs", file=sys.stderr)
        return 2
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)   # no lines of its creating a store
    try:
        report = sync_home(paths.runs_dir(), target)
    except (ValueError, OSError) as err:     # a store that cannot be used (StoreError), a DDL_HOME unreadable
        detail = f"{err.filename}: {err.strerror}" if isinstance(err, OSError) and err.strerror else err
        print(scrub(f"ddl-track: error: {detail}", target), file=sys.stderr)
        return 2
    for line in report.problems:
        print(scrub(f"ddl-track: {line}", target), file=sys.stderr)
    for line in report.running:
        print(scrub(f"ddl-track sync: {line}", target))
    if not report.journals:
        print(f"ddl-track sync: no journals in {paths.runs_dir()}; nothing to sync")
        return 0
    print(scrub(f"ddl-track sync: {report.summary()}", target))
    return 1 if report.problems else 0


def scrub(text: str, uri: str) -> str:
    """The text with the target's password (in its URI or MLFLOW_TRACKING_PASSWORD) replaced by ***."""
    from .store import redacted
    password = urllib.parse.urlsplit(uri).password if "://" in uri else None
    for secret in (password, password and urllib.parse.unquote(password), os.environ.get("MLFLOW_TRACKING_PASSWORD")):
        if secret:
            text = text.replace(secret, "***")
    return redacted(text)
