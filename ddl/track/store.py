"""MLflow: one experiment per sweep, one run per job (found again by its signature tag).

The store is `ddl.paths.tracking_uri()`: the project's SQLite file (concurrency-safe for the
local launcher's parallel jobs: SQLite serialises writers and MLflow retries on a busy file),
or MLFLOW_TRACKING_URI for a team server. Artifacts go to DDL_HOME/mlartifacts/<experiment>.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from .. import paths

SIGNATURE_TAG = "ddl.signature"
ERROR_TAG, EVAL_ERROR_TAG = "ddl.error", "ddl.eval_error"
REPLACES_TAG = "ddl.replaces"      # a run that took over the curves of a deleted one (open_run)
HISTORY_PREFIXES = ("train/", "val/", "beta/", "erank/")   # the per-step curves a run logs while training
# Earlier MLflow 3 UIs open an experiment on its GenAI overview unless it is marked as model training;
# 3.17's takes its workspace from the link instead (ddl.track.ui's carry it).
EXPERIMENT_KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"


class StoreError(ValueError):
    """The tracking store cannot be used: one line naming it and why."""


_opened: set[str] = set()   # URIs this process has checked (and, for the project store, created)
SQLITE_HEADER = b"SQLite format 3\x00"
SERVER_TIMEOUT_S = 10


def check() -> None:
    """Fail fast, in one line, on a store that cannot work, creating nothing: a project store that is
    not SQLite, a server that does not answer (MLflow itself would retry for minutes), a URI MLflow
    cannot use."""
    from mlflow.tracking import MlflowClient
    uri = paths.tracking_uri()
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        with contextlib.suppress(OSError):
            if db.stat().st_size and db.read_bytes()[:16] != SQLITE_HEADER:
                raise StoreError(f"tracking store {db}: not an SQLite database (damaged); move it aside to start "
                                 f"an empty store, or restore it from a backup")
        return
    where = f"MLFLOW_TRACKING_URI={uri}"
    if uri.startswith(("http://", "https://")):
        try:   # any HTTP answer, even 401, is a server
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=SERVER_TIMEOUT_S).close()
        except urllib.error.HTTPError:
            pass
        except (OSError, ValueError) as err:
            raise StoreError(f"{where}: no MLflow server answers ({getattr(err, 'reason', err)})") from None
    try:
        MlflowClient(uri).search_experiments(max_results=1)
    except Exception as err:
        raise StoreError(f"{where}: not a usable MLflow store ({type(err).__name__}: {_first_line(err)})") from None


def _open_store(uri: str) -> None:
    """check(), then create the project's SQLite store under a file lock, so processes that start
    together do not race through MLflow's schema migration. MLflow's own "Default" experiment, which
    every store has, keeps its (unused) artifacts in DDL_HOME/mlartifacts/0, as under `mlflow server
    --default-artifact-root`, rather than in ./mlruns/0 of whatever directory created the store."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    check()
    if not uri.startswith("sqlite:///"):
        return
    db = Path(uri.removeprefix("sqlite:///"))
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        with open(db.with_name(db.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            SqlAlchemyStore(uri, paths.artifacts_dir().as_uri())   # creates the schema and Default, or checks them
    except OSError as err:
        raise StoreError(f"tracking store {db}: {err.strerror or err} (DDL_HOME={paths.home()})") from None
    except Exception as err:
        raise StoreError(f"tracking store {db}: {type(err).__name__}: {_first_line(err)}") from None


def exists() -> bool:
    """False while the project's SQLite store has not been created: a command that only reads then has
    nothing to read, and creates nothing."""
    uri = paths.tracking_uri()
    return not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).is_file()


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
    """Get or create the experiment (artifacts under DDL_HOME/mlartifacts unless a server decides).
    A deleted one is a ValueError: MLflow refuses runs there, and restoring it is the user's call."""
    c = client()
    found = c.get_experiment_by_name(name)
    if found is not None and found.lifecycle_stage == "deleted":
        raise ValueError(f"experiment={name!r}: deleted in MLflow; restore it (mlflow experiments restore "
                         f"--experiment-id {found.experiment_id}) or choose another name")
    if found is not None:
        return found.experiment_id
    location = None  # a team server decides; the project store keeps artifacts beside it in DDL_HOME
    if paths.tracking_uri() == paths.project_store_uri():
        location = (paths.artifacts_dir() / name).as_uri()
    try:
        return c.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
    except Exception:  # another job created it first
        return c.get_experiment_by_name(name).experiment_id


def runs_with_signature(signature: str, experiment: str | None = None) -> list:
    """The runs of this signature, newest first: in one experiment, or in all of them."""
    c = client()
    if experiment is None:
        ids = [e.experiment_id for e in c.search_experiments()]
    else:
        found = c.get_experiment_by_name(experiment)
        ids = [found.experiment_id] if found is not None else []
    return c.search_runs(ids, f"tags.`{SIGNATURE_TAG}` = '{signature}'",
                         order_by=["attributes.start_time DESC"]) if ids else []


def open_run(experiment: str, signature: str, run_name: str, params: dict, tags: dict, resume_step: int = 0) -> str:
    """The job's run, for training that continues after `resume_step`: the newest of this signature in
    the experiment, reopened (a resumed job continues it, a re-run adds evaluations) with fresh tags and
    no stale error, when its curves end there. A run whose curves go further (logged after the
    checkpoint a killed job resumes from, or by a run whose checkpoints are gone) is replaced: a new run
    takes its curves up to `resume_step`, and the old one is deleted, so every step is logged once."""
    from mlflow.entities import Param, RunTag
    c = client()
    exp_id = experiment_id(experiment)
    replaced = None
    for run in runs_with_signature(signature, experiment)[:1]:
        run_id = run.info.run_id
        if last_logged_step(run) > resume_step:
            replaced = run
            break
        c.update_run(run_id, status="RUNNING")
        for stale in (ERROR_TAG, EVAL_ERROR_TAG):
            if stale in run.data.tags:
                c.delete_tag(run_id, stale)
        c.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in {**tags, "ddl.resumed": "true"}.items()])
        return run_id
    run = c.create_run(exp_id, run_name=run_name, tags={SIGNATURE_TAG: signature, **tags})
    items = [Param(k, str(v)) for k, v in params.items()]
    for i in range(0, len(items), 100):
        c.log_batch(run.info.run_id, params=items[i:i + 100])
    if replaced is not None:
        _copy_history(replaced, run.info.run_id, resume_step)
        c.set_tag(run.info.run_id, REPLACES_TAG, replaced.info.run_id)
        c.delete_run(replaced.info.run_id)
        print(f"{run_name} [{signature}]: MLflow run {replaced.info.run_id} has steps past {resume_step}, where "
              f"training continues; replaced by run {run.info.run_id} with its curves up to there", flush=True)
    return run.info.run_id


def last_logged_step(run) -> int:
    """The last step of the run's training curves (0 when it has none)."""
    c = client()
    steps = [m.step for key in run.data.metrics if key.startswith(HISTORY_PREFIXES)
             for m in c.get_metric_history(run.info.run_id, key)]
    return max(steps, default=0)


def holds_finished(run_id: str, experiment: str) -> bool:
    """True when the store holds this run, FINISHED and not deleted, in this experiment."""
    from mlflow.exceptions import MlflowException
    c = client()
    try:
        run = c.get_run(run_id)
    except MlflowException:
        return False
    return (run.info.status == "FINISHED" and run.info.lifecycle_stage == "active"
            and c.get_experiment(run.info.experiment_id).name == experiment)


def _copy_history(source, run_id: str, up_to_step: int) -> None:
    """The source run's training curves up to `up_to_step`, logged into run_id."""
    c = client()
    history = [m for key in source.data.metrics if key.startswith(HISTORY_PREFIXES)
               for m in c.get_metric_history(source.info.run_id, key) if m.step <= up_to_step]
    for i in range(0, len(history), 1000):
        c.log_batch(run_id, metrics=history[i:i + 1000])


def inherit_history(run_id: str, signature: str, up_to_step: int) -> str | None:
    """Copy the curves up to `up_to_step` into a run that resumed from a checkpoint written under
    another MLflow run (the same signature in another experiment, whose training it reuses).
    Returns the source run's id, or None when the run has those steps already or no source does."""
    c = client()
    if any(m.step <= up_to_step for m in c.get_metric_history(run_id, "train/loss")):
        return None
    sources = [(len([m for m in c.get_metric_history(r.info.run_id, "train/loss") if m.step <= up_to_step]), r)
               for r in runs_with_signature(signature) if r.info.run_id != run_id]
    count, source = max(sources, key=lambda pair: pair[0], default=(0, None))
    if not count:
        return None
    _copy_history(source, run_id, up_to_step)
    c.set_tag(run_id, "ddl.history_from", source.info.run_id)
    return source.info.run_id


REUSE_SKIPS_TAGS = (ERROR_TAG, EVAL_ERROR_TAG, REPLACES_TAG, "ddl.resumed", "ddl.sweep")


def copy_run(source_id: str, experiment: str, signature: str, run_name: str, params: dict, tags: dict) -> str:
    """A FINISHED run in `experiment` that is the source run (a finished run of the same signature in
    another experiment) again, without training or evaluating: its curves, summary metrics, dataset
    input, artifacts, and the tags that say how it was trained (commit, host, checkpoint), with
    `ddl.history_from` naming the run that trained it. The experiment's own run of the signature is
    reopened when it has one."""
    from mlflow.entities import Metric
    c = client()
    source = c.get_run(source_id)
    kept = {k: v for k, v in source.data.tags.items()
            if k.startswith(("ddl.", "mlflow.source.")) and k not in REUSE_SKIPS_TAGS}
    trained_by = source.data.tags.get("ddl.history_from", source_id)
    up_to = last_logged_step(source)
    run_id = open_run(experiment, signature, run_name, params, {**kept, **tags, "ddl.history_from": trained_by}, up_to)
    if not c.get_metric_history(run_id, "train/loss"):
        _copy_history(source, run_id, up_to)
    now = int(time.time() * 1000)
    summary = [Metric(k, v, now, 0) for k, v in source.data.metrics.items()
               if not k.startswith((*HISTORY_PREFIXES, "system/"))]
    for i in range(0, len(summary), 1000):
        c.log_batch(run_id, metrics=summary[i:i + 1000])
    if source.inputs and source.inputs.dataset_inputs:
        c.log_inputs(run_id, datasets=source.inputs.dataset_inputs)
    with tempfile.TemporaryDirectory() as tmp, _quiet_downloads():
        if c.list_artifacts(source_id):
            c.log_artifacts(run_id, c.download_artifacts(source_id, "", tmp))
    c.set_terminated(run_id, status="FINISHED")
    return run_id


@contextlib.contextmanager
def _quiet_downloads():
    """No progress bar from MLflow's artifact download: a sweep's console shows its own table."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def log_dataset(run_id: str, name: str, digest: str, path: str, profile: dict) -> None:
    """The run's training data as an MLflow dataset input (the runs table's Dataset column)."""
    import json

    from mlflow.entities import Dataset, DatasetInput, InputTag
    dataset = Dataset(name=name, digest=digest, source_type="local", source=json.dumps({"uri": path}),
                      profile=json.dumps(profile))
    client().log_inputs(run_id, datasets=[DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training")])])


def system_metrics_monitor(run_id: str):
    """MLflow's own system metrics (CPU, memory, disk, network; GPU where its library finds one) for the
    run while it trains: a started monitor to finish(), or None where psutil is missing."""
    try:
        import psutil  # noqa: F401 - MLflow's monitors need it
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError:
        return None
    import logging
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)     # no start/stop lines per job
    monitor = SystemMetricsMonitor(run_id, resume_logging=True, tracking_uri=paths.tracking_uri())
    monitor.start()
    return monitor


class MLflowLogger:
    """The trainer's MetricLogger: metrics buffered and written in batches (log_batch) by MLflow's
    async logging thread, so the training loop hands a batch over at most once every `flush_s`
    seconds and waits only if the previous batch is still being written. flush() (before each
    checkpoint) and close() wait for the last one and raise what a write raised."""

    def __init__(self, run_id: str, flush_s: float = 5.0, max_buffer: int = 900):
        self.run_id, self.flush_s, self.max_buffer = run_id, flush_s, max_buffer
        self._buffer: list = []
        self._writing: list = []                      # RunOperations of the batches in flight
        self._last_flush = time.monotonic()
        self._client = client()
        self._system = system_metrics_monitor(run_id)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self._buffer.extend(Metric(k, float(v), now, step) for k, v in metrics.items())
        if len(self._buffer) >= self.max_buffer or time.monotonic() - self._last_flush > self.flush_s:
            self._hand_over()

    def _hand_over(self) -> None:
        self._wait()
        self._writing = [self._client.log_batch(self.run_id, metrics=self._buffer[i:i + 1000], synchronous=False)
                         for i in range(0, len(self._buffer), 1000)]   # MLflow takes 1000 metrics a call
        self._buffer = []
        self._last_flush = time.monotonic()

    def _wait(self) -> None:
        writing, self._writing = self._writing, []
        for operation in writing:
            operation.wait()

    def flush(self) -> None:
        """Every metric logged so far is in the store when this returns."""
        self._hand_over()
        self._wait()

    def close(self) -> None:
        self.flush()
        if self._system is not None:
            self._system.finish()
            samples = self._system.aggregate_metrics()   # taken since it last logged: all of a short run's
            if samples:
                self._system.publish_metrics(samples)
                self._system.mlflow_logger.flush()
            self._system = None


def close_run(run_id: str, status: str, *, metrics: dict[str, float] | None = None,
              texts: dict[str, str] | None = None, files: list[Path] | None = None, error: str | None = None) -> None:
    """End the run FINISHED / FAILED / KILLED with its summary metrics, artifacts and error line."""
    c = client()
    if metrics:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        c.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (texts or {}).items():
            (Path(tmp) / name).write_text(text)
            c.log_artifact(run_id, str(Path(tmp) / name))
    for path in files or []:
        if Path(path).is_file():
            c.log_artifact(run_id, str(path))
    if error:
        c.set_tag(run_id, ERROR_TAG, error[:5000])
    c.set_terminated(run_id, status=status)



def log_evaluation(signature: str, scores: dict[str, float], results_json: str) -> list[str]:
    """Attach a later evaluation (ddl-eval) to every run of this signature, in any experiment."""
    from mlflow.entities import Metric
    c = client()
    runs = runs_with_signature(signature)
    now = int(time.time() * 1000)
    for run in runs:
        c.log_batch(run.info.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in scores.items()])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "eval_results.json"
            path.write_text(results_json)
            c.log_artifact(run.info.run_id, str(path))
    return [run.info.run_id for run in runs]
