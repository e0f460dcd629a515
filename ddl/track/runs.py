"""Writing runs: every fact a run gives MLflow is also appended to the journal in its folder
(`runs/<signature>/journal.jsonl`, `ddl.track.journal`), so the folder alone can rebuild the run
in any store (`ddl.track.sync`). The journal is written first: what MLflow holds, it holds too.

Ownership in a shared store: a run is reopened or replaced only by the home that wrote it (its own
interrupted run); a run of another home is never changed, and a FINISHED run is never deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

from .. import paths
from . import store
from .journal import Journal, file_sha256

ARTIFACTS = "artifacts"       # runs/<sig>/artifacts/<run id>/<path>: the local copy of each artifact logged
CHECKPOINT_PREFIX = "checkpoint/"


def _now_ms() -> int:
    return int(time.time() * 1000)


class TrackedRun:
    """One MLflow run and its journal: each method writes the journal, then MLflow."""

    def __init__(self, run_id: str, run_dir: Path):
        self.id, self.run_dir = run_id, Path(run_dir)
        self.journal = Journal(self.run_dir)
        self.client = store.client()

    @classmethod
    def create(cls, experiment: str, run_dir: Path, run_name: str, params: dict, tags: dict) -> "TrackedRun":
        """A new RUNNING run in the experiment, written by this home."""
        tags = {**tags, **store.home_tags()}
        mlflow_run = store.client().create_run(store.experiment_id(experiment), run_name=run_name, tags=tags)
        run = cls(mlflow_run.info.run_id, run_dir)
        run.journal.append("run", run.id, experiment=experiment, name=run_name,
                           start_time=mlflow_run.info.start_time, home=tags[store.HOME_ID_TAG])
        run.journal.append("tags", run.id, tags={k: str(v) for k, v in tags.items()})
        run.log_params(params)
        return run

    def log_params(self, params: dict) -> None:
        from mlflow.entities import Param
        params = {k: str(v) for k, v in params.items()}
        self.journal.append("params", self.id, params=params)
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.id, params=items[i:i + 100])

    def set_tags(self, tags: dict) -> None:
        from mlflow.entities import RunTag
        tags = {k: str(v) for k, v in tags.items()}
        self.journal.append("tags", self.id, tags=tags)
        self.client.log_batch(self.id, tags=[RunTag(k, v) for k, v in tags.items()])

    def delete_tag(self, key: str) -> None:
        self.journal.append("delete_tag", self.id, key=key)
        self.client.delete_tag(self.id, key)

    def journal_points(self, metrics: list) -> None:
        """Only the journal: for points MLflow gets later (the training logger's batches)."""
        self.journal.append("metrics", self.id, points=[[m.key, m.value, m.timestamp, m.step] for m in metrics])

    def log_points(self, metrics: list) -> None:
        """MLflow Metric objects (key, value, timestamp, step)."""
        if not metrics:
            return
        self.journal_points(metrics)
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.id, metrics=metrics[i:i + 1000])

    def log_summary(self, values: dict[str, float]) -> None:
        """Numbers without a step (final/..., eval/...), logged at step 0."""
        from mlflow.entities import Metric
        now = _now_ms()
        self.log_points([Metric(k, float(v), now, 0) for k, v in values.items()])

    def log_dataset(self, name: str, digest: str, source: str, profile: str, context: str = "training") -> None:
        from mlflow.entities import Dataset, DatasetInput, InputTag
        self.journal.append("dataset", self.id, name=name, digest=digest, source=source, source_type="local",
                            profile=profile, context=context)
        dataset = Dataset(name=name, digest=digest, source_type="local", source=source, profile=profile)
        inputs = [DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])]
        try:
            self.client.log_inputs(self.id, datasets=inputs)
        except Exception as err:   # two runs of one experiment adding the same dataset at once: it is there now
            if "UNIQUE constraint" not in str(err) and "UniqueViolation" not in str(err):
                raise
            self.client.log_inputs(self.id, datasets=inputs)

    def log_file(self, path: Path, artifact_dir: str | None = None, keep_copy: bool = True) -> None:
        """An artifact: copied into the run folder (`keep_copy`, for files that change or go away), journaled
        with its sha256, then uploaded."""
        path = Path(path)
        local = path
        if keep_copy:
            local = self.run_dir / ARTIFACTS / self.id / (artifact_dir or "") / path.name
            local.parent.mkdir(parents=True, exist_ok=True)
            if local.resolve() != path.resolve():
                shutil.copyfile(path, local)
        artifact_path = f"{artifact_dir}/{path.name}" if artifact_dir else path.name
        self.journal.append("artifact", self.id, path=artifact_path, file=str(local.relative_to(self.run_dir)),
                            sha256=file_sha256(local), size=local.stat().st_size)
        self.client.log_artifact(self.id, str(local), artifact_dir)

    def log_text(self, name: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / name).write_text(text)
            self.log_file(Path(tmp) / name)

    def terminate(self, status: str) -> None:
        end = _now_ms()
        self.journal.append("status", self.id, status=status, end_time=end)
        self.client.set_terminated(self.id, status=status, end_time=end)
        self.journal.sync()

    def reopen(self, tags: dict) -> None:
        """RUNNING again (a resumed job, or one adding evaluations), with fresh tags and no stale error."""
        self.journal.append("status", self.id, status="RUNNING", end_time=None)
        self.client.update_run(self.id, status="RUNNING")
        run = self.client.get_run(self.id)
        for stale in (store.ERROR_TAG, store.EVAL_ERROR_TAG):
            if stale in run.data.tags:
                self.delete_tag(stale)
        self.set_tags({**tags, **store.home_tags(), "ddl.resumed": "true"})

    def delete(self) -> None:
        """Only for this home's own unfinished run (open_run's replace, a run that lost the claim)."""
        self.journal.append("deleted", self.id)
        self.client.delete_run(self.id)

    def lose_claim(self, rival: str) -> None:
        """This home's new run, when another home (`rival`) started its signature first: ended KILLED, saying
        to whom it lost, then deleted, so it shows as RUNNING neither in the store's trash nor in a store its
        journal rebuilds."""
        self.set_tags({store.LOST_CLAIM_TAG: f"to {rival}, which started first"})
        self.terminate("KILLED")
        self.delete()


def open_run(experiment: str, signature: str, run_name: str, params: dict, tags: dict, run_dir: Path,
             resume_step: int = 0) -> TrackedRun:
    """The job's run, for training that continues after `resume_step`: this home's newest run of the
    signature in the experiment, reopened (a resumed job continues it, a re-run adds evaluations), when its
    curves end there. An unfinished one whose curves go further (logged after the checkpoint a killed job
    resumes from) is replaced: a new run takes its curves up to `resume_step` and the old one is deleted,
    so every step is logged once. Another home's runs, and FINISHED runs, are never deleted: a new run is
    made beside them."""
    tags = {store.SIGNATURE_TAG: signature, **tags}
    own = [r for r in store.runs_with_signature(signature, experiment) if store.is_own(r)][:1]
    if own and last_logged_step(own[0]) <= resume_step:
        run = TrackedRun(own[0].info.run_id, run_dir)
        run.reopen(tags)
        return run
    replaced = own[0] if own and own[0].info.status != "FINISHED" else None
    run = TrackedRun.create(experiment, run_dir, run_name, params, tags)
    if replaced is not None:
        _copy_history(replaced, run, resume_step)
        run.set_tags({store.REPLACES_TAG: replaced.info.run_id})
        TrackedRun(replaced.info.run_id, run_dir).delete()
        print(f"{run_name} [{signature}]: MLflow run {replaced.info.run_id} has steps past {resume_step}, where "
              f"training continues; replaced by run {run.id} with its curves up to there", flush=True)
    return run


def last_logged_step(run) -> int:
    """The last step of the run's training curves (0 when it has none)."""
    c = store.client()
    steps = [m.step for key in run.data.metrics if key.startswith(store.HISTORY_PREFIXES)
             for m in c.get_metric_history(run.info.run_id, key)]
    return max(steps, default=0)


def _copy_history(source, target: TrackedRun, up_to_step: int) -> None:
    """The source run's training curves up to `up_to_step`, logged into the target."""
    c = store.client()
    target.log_points([m for key in source.data.metrics if key.startswith(store.HISTORY_PREFIXES)
                       for m in c.get_metric_history(source.info.run_id, key) if m.step <= up_to_step])


def inherit_history(run: TrackedRun, signature: str, up_to_step: int) -> str | None:
    """Copy the curves up to `up_to_step` into a run that resumed from a checkpoint written under another
    MLflow run (the same signature in another experiment or home, whose training it continues).
    Returns the source run's id, or None when the run has those steps already or no source does."""
    c = store.client()
    if any(m.step <= up_to_step for m in c.get_metric_history(run.id, "train/loss")):
        return None
    sources = [(len([m for m in c.get_metric_history(r.info.run_id, "train/loss") if m.step <= up_to_step]), r)
               for r in store.runs_with_signature(signature) if r.info.run_id != run.id]
    count, source = max(sources, key=lambda pair: pair[0], default=(0, None))
    if not count:
        return None
    _copy_history(source, run, up_to_step)
    run.set_tags({"ddl.history_from": source.info.run_id})
    return source.info.run_id


REUSE_SKIPS_TAGS = (store.ERROR_TAG, store.EVAL_ERROR_TAG, store.REPLACES_TAG, "ddl.resumed", "ddl.sweep",
                    store.HOME_ID_TAG, store.HOME_TAG, store.HEARTBEAT_TAG)


def copy_run(source_id: str, experiment: str, signature: str, run_name: str, params: dict, tags: dict,
             run_dir: Path) -> TrackedRun:
    """A FINISHED run in `experiment` that is the source run (a finished run of the same signature in
    another experiment) again, without training or evaluating: its curves, summary metrics, dataset
    input, artifacts (not its checkpoint: that stays with the run that trained it), and the tags that say
    how it was trained, with `ddl.history_from` naming the run that trained it."""
    c = store.client()
    source = c.get_run(source_id)
    kept = {k: v for k, v in source.data.tags.items()
            if k.startswith(("ddl.", "mlflow.source.")) and k not in REUSE_SKIPS_TAGS}
    trained_by = source.data.tags.get("ddl.history_from", source_id)
    up_to = last_logged_step(source)
    run = open_run(experiment, signature, run_name, params, {**kept, **tags, "ddl.history_from": trained_by},
                   run_dir, up_to)
    if not c.get_metric_history(run.id, "train/loss"):
        _copy_history(source, run, up_to)
    run.log_summary({k: v for k, v in source.data.metrics.items()
                     if not k.startswith((*store.HISTORY_PREFIXES, "system/"))})
    for dataset_input in (source.inputs.dataset_inputs if source.inputs else []):
        d = dataset_input.dataset
        context = next((t.value for t in dataset_input.tags if t.key == "mlflow.data.context"), "training")
        run.log_dataset(d.name, d.digest, d.source, d.profile, context)
    with tempfile.TemporaryDirectory() as tmp, _quiet_downloads():
        for item in c.list_artifacts(source_id):
            if item.is_dir or item.path.startswith(CHECKPOINT_PREFIX):
                continue
            run.log_file(Path(c.download_artifacts(source_id, item.path, tmp)))
    run.terminate("FINISHED")
    return run


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


def close_run(run: TrackedRun, status: str, *, metrics: dict[str, float] | None = None,
              texts: dict[str, str] | None = None, files: list[Path] | None = None, error: str | None = None) -> None:
    """End the run FINISHED / FAILED / KILLED with its summary metrics, artifacts and error line."""
    if metrics:
        run.log_summary(metrics)
    for name, text in (texts or {}).items():
        run.log_text(name, text)
    for path in files or []:
        if Path(path).is_file():
            run.log_file(Path(path))
    if error:
        run.set_tags({store.ERROR_TAG: error[:5000]})
    run.terminate(status)


def log_evaluation(signature: str, scores: dict[str, float], results_json: str, run_dir: Path) -> list[str]:
    """Attach a later evaluation (ddl-eval) to every run of this signature, in any experiment and of any
    home: an evaluation adds numbers, it changes none."""
    runs = store.runs_with_signature(signature)
    for found in runs:
        run = TrackedRun(found.info.run_id, run_dir)
        run.log_summary(scores)
        run.log_text("eval_results.json", results_json)
    return [found.info.run_id for found in runs]


def _finished_histories(run_dir: Path, experiment: str, evaluations=()) -> list:
    return [h for h in Journal(run_dir).runs().values()
            if h.status == "FINISHED" and not h.deleted and h.experiment == experiment
            and set(evaluations) <= store.evaluations_in(point[0] for point in h.points)]


def journal_holds_finished(run_dir: Path, experiment: str, evaluations=()) -> bool:
    """True when the run folder's journal holds a FINISHED run in this experiment with these evaluations."""
    return (Path(run_dir) / Journal.FILE).is_file() and bool(_finished_histories(run_dir, experiment, evaluations))


def rebuild(run_dir: Path, experiment: str) -> None:
    """Put the journal's FINISHED runs of this experiment back into a store that lost them (ddl.track.sync)."""
    from .sync import sync_run
    for history in _finished_histories(run_dir, experiment):
        outcome = sync_run(history, Path(run_dir), store.client())
        where = f"the store ({store.redacted(paths.tracking_uri())})"
        if outcome.state in ("created", "updated"):
            print(f"{Path(run_dir).name}: {where} had lost its run {history.uid} in '{experiment}'; rebuilt from "
                  f"{Path(run_dir) / Journal.FILE}", flush=True)
        for problem in outcome.problems:
            print(f"{Path(run_dir).name}: {problem}", flush=True)
