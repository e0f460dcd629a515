"""MLflow's store: the connection, and what it holds of a signature (finished, running elsewhere).

The store is `ddl.paths.tracking_uri()`: the project's SQLite file (concurrency-safe for the
local launcher's parallel jobs: SQLite serialises writers and MLflow retries on a busy file),
or MLFLOW_TRACKING_URI for a team server. The store is the source of truth of what is done: a
signature FINISHED there (with the evaluations asked for) is never trained again, by any home.
Writing runs is `ddl.track.runs`'s, which keeps each run's journal in its folder as well.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import NamedTuple

from .. import paths
from . import mlflow_private

SIGNATURE_TAG = "ddl.signature"
ERROR_TAG, EVAL_ERROR_TAG = "ddl.error", "ddl.eval_error"
REPLACES_TAG = "ddl.replaces"      # a run that took over the curves of a deleted one (open_run)
REUSED_FROM_TAG = "ddl.reused_from"   # the experiment whose finished run this one copies (runs.copy_run)
LOST_CLAIM_TAG = "ddl.lost_claim"     # on a deleted run: the home that started its signature first (runs.lose_claim)
# Which home wrote a run (paths.home_id, and the home's host:path for people), and when it last said it was alive.
HOME_ID_TAG, HOME_TAG, HEARTBEAT_TAG = "ddl.home_id", "ddl.home", "ddl.heartbeat"
HEARTBEAT_S = 30          # a training run refreshes its heartbeat this often (with its metrics)
STALE_AFTER_S = 180       # a RUNNING run silent this long is taken for dead (a killed job, a lost node)
CLAIM_SETTLE_S = 2.0      # a claim on a shared store is judged this long after its run opened (settle_claim)
HISTORY_PREFIXES = ("train/", "val/", "beta/", "erank/")   # the per-step curves a run logs while training
PARENT_TAG = "mlflow.parentRunId"      # MLflow's own: a search's trials nest under its parent run in the UI
SEARCH_FOLDER_PREFIX = "search-"       # runs/search-<id>/: the journal of a search's parent run
# Earlier MLflow 3 UIs open an experiment on its GenAI overview unless it is marked as model training;
# 3.17's takes its workspace from the link instead (ddl.track.ui's carry it).
EXPERIMENT_KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"


class StoreError(ValueError):
    """The tracking store cannot be used: one line naming it and why."""


_opened: set[str] = set()   # URIs this process has checked (and, for the project store, created)
SQLITE_HEADER = b"SQLite format 3\x00"
SERVER_TIMEOUT_S = 10
# Lookup: a plan's runs of one status are read in one search when the store holds at most this many a signature
# (a run costs 1.5-3 ms to read, a signature's own search 4-5 ms, in a SQLite store).
BULK_RUNS_PER_SIGNATURE = 2
SEARCH_MAX_RESULTS = 50_000      # MLflow's most runs one search returns


def check(patience_s: float = 0) -> None:
    """Fail fast, in one line, on a store that cannot work, creating nothing: a project store that is
    not SQLite, a server that does not answer (MLflow itself would retry for minutes; a sweep's job
    waits up to `patience_s` for a server its launcher reached), a URI MLflow cannot use."""
    from mlflow.tracking import MlflowClient
    uri = paths.tracking_uri()
    if (db := paths.sqlite_file(uri)) is not None:
        with contextlib.suppress(OSError):
            if db.stat().st_size and db.read_bytes()[:16] != SQLITE_HEADER:
                raise StoreError(f"tracking store {db}: not an SQLite database (damaged); move it aside to start "
                                 f"an empty store, or restore it from a backup")
        return
    where = f"MLFLOW_TRACKING_URI={redacted(uri)}"
    if uri.startswith(("http://", "https://")):
        _await_server(uri, where, patience_s)
    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except Exception as err:
        code, user = getattr(err, "error_code", ""), os.environ.get("MLFLOW_TRACKING_USERNAME")
        if code == "UNAUTHENTICATED":          # a basic-auth server; its password is never named
            raise StoreError(f"{where}: the server did not accept MLFLOW_TRACKING_USERNAME={user} with its "
                             f"MLFLOW_TRACKING_PASSWORD (HTTP 401); check both" if user else
                             f"{where}: the server asks for a login (HTTP 401); set MLFLOW_TRACKING_USERNAME and "
                             f"MLFLOW_TRACKING_PASSWORD") from None
        if code == "PERMISSION_DENIED":
            raise StoreError(f"{where}: MLFLOW_TRACKING_USERNAME={user} may not read the server's experiments "
                             f"(HTTP 403); ask its admin for a permission") from None
        raise StoreError(f"{where}: not a usable MLflow store ({type(err).__name__}: {_first_line(err)})") from None


def _await_server(uri: str, where: str, patience_s: float) -> None:
    """Any HTTP answer, even 401, is a server; none within `patience_s` is a StoreError."""
    parts = urllib.parse.urlsplit(uri)
    health = parts._replace(netloc=parts.netloc.rpartition("@")[2], path=parts.path.rstrip("/") + "/health")
    deadline = time.monotonic() + patience_s
    while True:
        try:
            urllib.request.urlopen(urllib.parse.urlunsplit(health), timeout=SERVER_TIMEOUT_S).close()
            return
        except urllib.error.HTTPError:
            return
        except (OSError, ValueError) as err:
            if time.monotonic() > deadline:
                raise StoreError(f"{where}: no MLflow server answers ({getattr(err, 'reason', err)})") from None
            time.sleep(2)


def _open_store(uri: str) -> None:
    """check(), then create the project's SQLite store under a file lock, so processes that start
    together do not race through MLflow's schema migration. MLflow's own "Default" experiment, which
    every store has, keeps its (unused) artifacts in mlartifacts/0 beside the database (paths.artifacts_dir), as
    under `mlflow server --default-artifact-root`, rather than in ./mlruns/0 of whatever directory created it."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    check()
    if (db := paths.sqlite_file(uri)) is None:
        return
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        with open(db.with_name(db.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not db.exists() and (template := _schema_template()):
                with open(template, "rb") as schema:
                    paths.write_atomic(db, lambda f: shutil.copyfileobj(schema, f))
            SqlAlchemyStore(uri, paths.artifacts_dir(uri).as_uri())   # creates the schema and Default, or checks them
    except OSError as err:
        raise StoreError(f"tracking store {db}: {err.strerror or err} (DDL_HOME={paths.home()})") from None
    except Exception as err:
        raise StoreError(f"tracking store {db}: {type(err).__name__}: {_first_line(err)}") from None


def _schema_template() -> Path | None:
    """An SQLite store holding MLflow's schema and no experiment, made once per MLflow version in the user's cache:
    a new home starts from a copy of it instead of running MLflow's ~60 schema migrations (about 1 s of CPU).
    MLflow's own store, opening the copy, finds every table at its head revision and adds the Default
    experiment with this home's artifact root, as on a store it migrated itself. A template that is not at
    MLflow's head (damaged) is made again. None where the cache cannot hold one: the store is then migrated
    in place."""
    from importlib.metadata import version

    template = paths.user_cache_dir() / f"mlflow-{version('mlflow')}-schema.db"
    if template.is_file() and mlflow_private.at_schema_head(template):
        return template
    building = template.with_name(f".{template.name}.{os.getpid()}.tmp")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        mlflow_private.create_schema(building)
        os.replace(building, template)                  # whole or absent, whichever home makes it first
        return template
    except Exception:
        with contextlib.suppress(OSError):
            building.unlink(missing_ok=True)
        return None


def exists() -> bool:
    """False while the project's SQLite store has not been created: a command that only reads then has
    nothing to read, and creates nothing."""
    db = paths.sqlite_file(paths.tracking_uri())
    return db is None or db.is_file()


def _first_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), "no detail")


def client():
    """The MLflow client of this project's store; StoreError (one line) when the store cannot be used."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = paths.tracking_uri()
    exported = os.environ.get("MLFLOW_TRACKING_URI")
    if uri not in _opened:
        _open_store(uri)
        _opened.add(uri)
    mlflow.set_tracking_uri(uri)                     # for the fluent API (query.load_runs)
    if exported is None:   # mlflow also exports it: child processes and a later DDL_HOME would inherit this store
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    return MlflowClient(uri)


def experiment_id(name: str) -> str:
    """Get or create the experiment (a SQLite store's artifacts beside it, paths.artifacts_dir; a server decides).
    A deleted one is a ValueError: MLflow refuses runs there, and restoring it is the user's call."""
    c = client()
    found = c.get_experiment_by_name(name)
    if found is not None and found.lifecycle_stage == "deleted":
        raise ValueError(f"experiment={name!r}: deleted in MLflow; restore it (mlflow experiments restore "
                         f"--experiment-id {found.experiment_id}) or choose another name")
    if found is not None:
        return found.experiment_id
    root = paths.artifacts_dir(paths.tracking_uri())
    location = None if root is None else (root / name).as_uri()
    try:
        return c.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
    except Exception:  # another job created it first
        return c.get_experiment_by_name(name).experiment_id


def experiment_names() -> dict[str, str]:
    """id -> name of the store's active experiments (none, and no store created, where there is no store)."""
    return {e.experiment_id: e.name for e in client().search_experiments()} if exists() else {}


def is_signature(name: str) -> bool:
    """A job's signature (a hash, `ref-<hash>` for an imported checkpoint), safe inside a search filter."""
    return re.fullmatch(r"[0-9a-z-]{1,64}", name) is not None


def _checked_signature(signature: str) -> str:
    if not is_signature(signature):
        raise ValueError(f"signature={signature!r}: not a run signature (lowercase letters, digits, -)")
    return signature


def runs_with_signature(signature: str, experiment: str | None = None, status: str | None = None) -> list:
    """The active runs of this signature, newest first: in one experiment, or in all of them; `status`
    (FINISHED, RUNNING) narrows them."""
    _checked_signature(signature)
    if not exists():               # a project store not created yet holds nothing, and a look creates none
        return []
    c = client()
    if experiment is None:
        ids = [e.experiment_id for e in c.search_experiments()]
    else:
        found = c.get_experiment_by_name(experiment)
        ids = [found.experiment_id] if found is not None else []
    return _signature_runs(ids, signature, status)


def _signature_runs(experiment_ids: list[str], signature: str, status: str | None = None) -> list:
    """The signature's runs in these experiments, newest first (none: no search, and no store created)."""
    if not experiment_ids:
        return []
    query = f"tags.`{SIGNATURE_TAG}` = '{signature}'" + (f" and attributes.status = '{status}'" if status else "")
    return client().search_runs(experiment_ids, query, order_by=["attributes.start_time DESC"])


def home_tags() -> dict[str, str]:
    """The tags that say which home writes a run, and that it is alive now."""
    return {HOME_ID_TAG: paths.home_id(), HOME_TAG: str(paths.home()), "ddl.host": socket.gethostname(),
            HEARTBEAT_TAG: str(int(time.time()))}


def is_own(run) -> bool:
    """True for a run this home wrote. A run from before homes were tagged counts as the project store's own."""
    owner = run.data.tags.get(HOME_ID_TAG)
    return owner == paths.home_id() if owner else paths.tracking_uri() == paths.project_store_uri()


class Stored(NamedTuple):
    """A signature's finished run in the store: where it is and its final numbers (`final/<metric>`)."""
    run_id: str
    experiment: str
    final: dict
    reused_from: str | None
    trained_by: str | None = None     # `host:home` of another home that wrote it (None: this home's)


def evaluations_in(metric_keys) -> set[str]:
    """The evaluations that metric keys hold, as 'task@shots', read off the `eval/<k>shot/<task>/n` keys."""
    found = set()
    for key in metric_keys:
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "eval" and parts[1].endswith("shot") and parts[3] == "n":
            found.add(f"{parts[2]}@{parts[1].removesuffix('shot')}")
    return found


def evaluations_of(run) -> set[str]:
    return evaluations_in(run.data.metrics)


def _stored(run, experiment: str) -> Stored:
    final = {k.removeprefix("final/"): v for k, v in run.data.metrics.items() if k.startswith("final/")}
    final.update({k: v for k, v in run.data.metrics.items() if k.startswith("eval/")})
    tags = run.data.tags
    other = None if is_own(run) else f"{tags.get('ddl.host', 'unknown host')}:{tags.get(HOME_TAG, 'unknown home')}"
    return Stored(run.info.run_id, experiment, final, tags.get(REUSED_FROM_TAG), other)


class Lookup:
    """What the store holds of many signatures (a plan's), each status's runs read once for all its questions.
    MLflow's filter has no IN for tags, so a signature is one search; a plan of hundreds of jobs asks first for the
    store's runs of a status in one search, capped at BULK_RUNS_PER_SIGNATURE runs a signature (about what its own
    searches would cost), and searches signature by signature only where the store holds more. A snapshot: a
    question after a write (a run rebuilt from its journal) needs a new one."""

    def __init__(self, signatures):
        self.signatures = frozenset(map(_checked_signature, signatures))
        self._experiments: dict[str, str] | None = None
        self._runs: dict[tuple[str, str], list] = {}       # (status, signature) -> its runs, newest first
        self._read_whole: dict[str, bool] = {}             # status -> whether its runs were all read at once

    def experiment_names(self) -> dict[str, str]:
        """store.experiment_names, read once."""
        if self._experiments is None:
            self._experiments = experiment_names()
        return self._experiments

    def runs(self, signature: str, status: str) -> list:
        """The signature's active runs of this status (FINISHED, RUNNING) in every active experiment, newest first."""
        if status not in self._read_whole:
            self._read_whole[status] = len(self.signatures) > 1 and self._read_all(status)
        if (status, signature) not in self._runs:
            self._runs[status, signature] = [] if self._read_whole[status] else self._search(signature, status)
        return self._runs[status, signature]

    def _search(self, signature: str, status: str) -> list:
        return _signature_runs(list(self.experiment_names()), signature, status)

    def _read_all(self, status: str) -> bool:
        """The store's runs of this status, by signature, in one search; False where there are more than the cap."""
        ids = list(self.experiment_names())
        cap = min(BULK_RUNS_PER_SIGNATURE * len(self.signatures), SEARCH_MAX_RESULTS - 1)
        found = client().search_runs(ids, f"attributes.status = '{status}'", max_results=cap + 1,
                                     order_by=["attributes.start_time DESC"]) if ids else []
        if len(found) > cap:
            return False
        for run in found:
            signature = run.data.tags.get(SIGNATURE_TAG)
            if signature in self.signatures:
                self._runs.setdefault((status, signature), []).append(run)
        return True


def finished(signature: str, experiment: str, evaluations=(), lookup: Lookup | None = None) -> Stored | None:
    """The signature's newest FINISHED run in this experiment holding these evaluations ('task@shots'),
    whichever home wrote it; None when there is none (the job runs, and adds what is missing)."""
    lookup = lookup or Lookup([signature])
    names = lookup.experiment_names()
    for run in lookup.runs(signature, "FINISHED"):
        if names[run.info.experiment_id] == experiment and set(evaluations) <= evaluations_of(run):
            return _stored(run, experiment)
    return None


def finished_elsewhere(signature: str, experiment: str, evaluations=(), lookup: Lookup | None = None) -> Stored | None:
    """A FINISHED run of the signature in another experiment with these evaluations, which can be copied
    here without training or evaluating; a run that trained is preferred to one that reused another."""
    lookup = lookup or Lookup([signature])
    names = lookup.experiment_names()
    found = [run for run in lookup.runs(signature, "FINISHED")
             if names[run.info.experiment_id] != experiment and set(evaluations) <= evaluations_of(run)]
    found.sort(key=lambda run: REUSED_FROM_TAG in run.data.tags)
    return _stored(found[0], names[found[0].info.experiment_id]) if found else None


def settle_claim() -> None:
    """Wait, after opening a run that claims something (a signature, a search's parent, a trial number), until
    a rival's run opened at the same moment is in a shared store: each client stamps its run's start time
    before its request reaches the server, so a rival stamped earlier may land later. Past this wait, every
    home sees the same first run. A home's own store has no rival home: no wait."""
    if paths.tracking_uri() != paths.project_store_uri():
        time.sleep(CLAIM_SETTLE_S)


def running_elsewhere(signature: str, besides=None, lookup: Lookup | None = None) -> str | None:
    """`host, home` of another home training this signature now (RUNNING, heartbeat fresh), or None.
    With `besides` (this job's own new run), only a rival that started first counts: of two homes that
    start one signature together, the later one leaves it."""
    now = time.time()
    for run in (lookup or Lookup([signature])).runs(signature, "RUNNING"):
        tags = run.data.tags
        if is_own(run) or now - float(tags.get(HEARTBEAT_TAG) or 0) > STALE_AFTER_S:
            continue
        if besides is not None and (run.info.start_time, run.info.run_id) >= (besides.info.start_time,
                                                                              besides.info.run_id):
            continue
        return f"{tags.get('ddl.host', 'unknown host')}, {tags.get(HOME_TAG, 'unknown home')}"
    return None


def redacted(uri: str) -> str:
    """A URI fit to print: a password in it is replaced by ***."""
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", uri)
