"""The task every job runs (in-process for `ddl-run`, in a submitit worker for `ddl-run -m`).

config -> RunConfig -> skip if finished -> MLflow run (resumed by signature) -> train (resumes
from its own checkpoint) -> optional lm-eval -> FINISHED, or FAILED with the error's first line.
Only rank 0 talks to MLflow and writes status; every rank trains.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import subprocess

from omegaconf import DictConfig, OmegaConf

from .. import paths
from ..text import plural
from . import status
from .configs import ConfigError
from .spec import Job, row_name
from .table import ProgressLogger, progress_seconds


def _git() -> tuple[str, str]:
    root = paths.project_root()
    if root is None:
        return "unknown", "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return commit or "unknown", str(bool(dirty)).lower()
    except OSError:
        return "unknown", "unknown"


def _join_submitit_ddp() -> str:
    """Export torch.distributed's environment (submitit's helper) when a job has several tasks."""
    try:
        import submitit
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a submitit job
        return "none"
    if env.num_tasks > 1:   # each rank keeps every GPU visible and picks cuda:LOCAL_RANK itself
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return env.cluster


def _tags(job: Job, launcher: str) -> dict:
    import torch
    commit, dirty = _git()
    tokenizer = job.run.data.tokenizer
    return {"mlflow.source.git.commit": commit, "mlflow.source.name": "ddl-run", "mlflow.source.type": "JOB",
            "ddl.sweep": job.experiment, "ddl.git_commit": commit, "ddl.git_dirty": dirty, "ddl.launcher": launcher,
            "ddl.slurm_job_id": os.environ.get("SLURM_JOB_ID", ""), "ddl.host": socket.gethostname(),
            "ddl.torch": torch.__version__, "ddl.cuda": str(torch.version.cuda),
            "ddl.python": platform.python_version(), "ddl.tokenizer": tokenizer,
            "ddl.loss_unit": f"nats/token ({tokenizer})", "ddl.row": row_name(job.run.model)}


def run_task(cfg: DictConfig) -> dict:
    """The job's steps: claim the signature -> skip if done, reuse if done in another experiment -> set
    up and resume training -> open its MLflow run -> train -> evaluate -> close the run. Every error
    before training starts is one line, and leaves no run. A signature another process is working on
    is left to it."""
    job = Job.from_config(cfg)
    progress_seconds()   # a bad DDL_PROGRESS_S is one line, before anything is written
    job.label = status.read(paths.runs_dir() / job.signature).get("label", "")   # the sweep's name for it
    launcher = _join_submitit_ddp()
    is_main = os.environ.get("RANK", "0") == "0"
    return _claimed(job, is_main, lambda run_dir: _run_claimed(cfg, job, run_dir, launcher, is_main))


def reuse(job: Job, source: str, entry: dict) -> dict:
    """The sweep launcher's way to reuse a job finished in experiment `source` (status.finished_elsewhere),
    in its own process: no job is launched for it."""
    return _claimed(job, True, lambda run_dir: _reuse(job, run_dir, source, entry, True))


def _claimed(job: Job, is_main: bool, work) -> dict:
    run_dir = paths.runs_dir() / job.signature
    try:
        with status.claim(run_dir) if is_main else contextlib.nullcontext():
            return work(run_dir)
    except status.RunningElsewhere as err:
        print(f"{job.name} [{job.signature}]: {err}; left to it")
        return {"signature": job.signature, "status": status.ELSEWHERE, "detail": str(err)}


def _run_claimed(cfg: DictConfig, job: Job, run_dir, launcher: str, is_main: bool) -> dict:
    from ..track import store
    evaluations = job.evaluation.evaluations()
    try:
        if is_main:
            store.check()
        done = status.finished_in(run_dir, job.experiment, evaluations)
        elsewhere = None if done else status.finished_elsewhere(run_dir, job.experiment, evaluations)
    except ValueError as err:   # the store cannot be used
        raise ConfigError(str(err)) from None
    if done:
        print(f"{job.name} [{job.signature}]: already finished in '{job.experiment}' (MLflow run {done['run_id']}); "
              f"skipped")
        return {"signature": job.signature, "status": "skipped", **done}
    if elsewhere:
        return _reuse(job, run_dir, *elsewhere, is_main)
    trainer = _set_up(job, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)   # other ranks write their log there too
    run_id = _open_run(job, run_dir, launcher, trainer.step) if is_main else None
    log_path = run_dir / "train.log"
    with open(log_path, "a", encoding="utf-8") as log_file:
        trainer.logger = logger = _loggers(job, run_dir, run_id, log_file)
        try:
            result = trainer.fit()
            logger.close()
            outcome = Outcome(cfg, dict(result.final))
            if is_main:
                _record(job, run_dir, run_id, result, outcome, log_path)
            print(f"{job.name} [{job.signature}]: val/loss {outcome.final['val/loss']:.4f}  "
                  f"({plural(result.steps, 'step')}, {result.seconds:.0f} s)")
            return {"signature": job.signature, "status": "finished", "run_id": run_id, "final": outcome.final}
        except BaseException as err:
            with _signals_held():
                logger.close()
                if is_main and not (isinstance(err, SystemExit) and launcher == "slurm"):  # SLURM requeues it
                    _close_interrupted(run_dir, run_id, err, log_path)
            raise


def _reuse(job: Job, run_dir, source: str, entry: dict, is_main: bool) -> dict:
    """Finished in experiment `source` with every evaluation asked for: its run there is copied into
    this experiment (store.copy_run) and the job is done here, without training or evaluating."""
    from ..track import store
    run_id = None
    if is_main:
        run_id = store.copy_run(entry["run_id"], job.experiment, job.signature, job.name, job.params(),
                                {"ddl.sweep": job.experiment, "ddl.reused_from": source})
        status.mark_done(run_dir, job.experiment, {**entry, "run_id": run_id, "reused_from": source})
        steps = job.run.train.steps
        status.write(run_dir, state=status.REUSED, reused_from=source, name=job.name, label=job.label, run_id=run_id,
                     step=steps,
                     steps=steps, val_loss=entry["final"].get("val/loss"), eta_s=None, error=None)
        print(f"{job.name} [{job.signature}]: {status.reused(source)}: MLflow run {run_id}, no training", flush=True)
    return {"signature": job.signature, "status": status.REUSED, "reused_from": source, "run_id": run_id,
            "final": entry["final"]}


def _set_up(job: Job, run_dir):
    """The trainer, set up (device, data, model) and resumed from the newest intact checkpoint; what
    fails here (no such device, a damaged dataset, a foreign checkpoint) is one line."""
    from ..train import Trainer
    try:
        return Trainer(job.run, run_dir, None, job.signature)
    except ValueError as err:
        if (run_dir / status.FILE).is_file():   # a sweep's job: its table shows the reason
            status.write(run_dir, state="failed", error=str(err))
        raise ConfigError(str(err)) from None


def _open_run(job: Job, run_dir, launcher: str, resume_step: int) -> str:
    """The job's MLflow run (reopened by signature when its curves end where training resumes) and its
    status file."""
    from ..track import store
    try:
        run_id = store.open_run(job.experiment, job.signature, job.name, job.params(), _tags(job, launcher),
                                resume_step)
    except ValueError as err:   # a deleted experiment
        raise ConfigError(str(err)) from None
    status.write(run_dir, state="running", name=job.name, run_id=run_id, reused_from=None, error=None)
    return run_id


def _loggers(job: Job, run_dir, run_id: str | None, log_file):
    """The console's progress line and train.log's step lines on every rank; MLflow and the status file on
    rank 0 (run_id is set there)."""
    from ..train import ConsoleLogger, MultiLogger
    loggers = [ProgressLogger(f"{job.name} [{job.signature}]", job.run.train.steps), ConsoleLogger(log_file)]
    if run_id is not None:
        from ..track import store
        loggers += [store.MLflowLogger(run_id), status.StatusLogger(run_dir, job.run.train.steps)]
    return MultiLogger(*loggers)


class Outcome:
    """What a finished job records: its final numbers, the summary metrics, the artifacts' texts, and
    the evaluations it ran (or why they were skipped)."""

    def __init__(self, cfg: DictConfig, final: dict):
        self.final = final
        self.summary = {f"final/{k}": v for k, v in final.items()}   # the report's numbers
        self.texts = {"config.yaml": OmegaConf.to_yaml(cfg, resolve=True)}
        self.evaluated: list[str] = []
        self.eval_error: str | None = None

    def add_evaluation(self, job: Job, trained) -> None:
        """lm-eval's scores join the numbers; a failure is kept as a line, the training results stand."""
        try:
            scores, results_json = _evaluate(job, trained)
        except Exception as err:
            reason = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            self.eval_error = f"{reason} -- then: ddl-eval {job.signature} --tasks {' '.join(job.evaluation.tasks)}"
            print(f"{job.name} [{job.signature}]: evaluation skipped: {self.eval_error}")
            return
        self.final.update(scores)
        self.summary.update(scores)
        self.texts["eval_results.json"] = results_json
        self.evaluated = job.evaluation.evaluations()


def _record(job: Job, run_dir, run_id: str, result, outcome: Outcome, log_path) -> None:
    """Rank 0: inherited curves, the evaluation, then the run closed FINISHED and the job marked done."""
    import json

    from ..track import store
    if result.resumed_from:     # trained (partly) under another experiment's run
        store.inherit_history(run_id, job.signature, result.resumed_from)
    _log_dataset(run_id, result.extra["dataset"])
    if result.checkpoint:
        store.client().set_tag(run_id, "ddl.checkpoint", result.checkpoint)
    if job.evaluation.evaluations():
        outcome.add_evaluation(job, result)
    if outcome.eval_error:
        store.client().set_tag(run_id, store.EVAL_ERROR_TAG, outcome.eval_error[:5000])
    outcome.texts["final_metrics.json"] = json.dumps(outcome.final, indent=1)
    store.close_run(run_id, "FINISHED", metrics=outcome.summary, texts=outcome.texts, files=[log_path])
    status.mark_done(run_dir, job.experiment, {"run_id": run_id, "final": outcome.final,
                                               "evaluations": outcome.evaluated})
    status.write(run_dir, state="finished", **{"val_loss": outcome.final.get("val/loss")})


def _log_dataset(run_id: str, dataset_dir: str) -> None:
    """The token dataset as the run's MLflow input: its name, a digest of its shards, its token counts."""
    import hashlib

    from ..data import open_dataset
    from ..track import store
    manifest = open_dataset(dataset_dir).manifest
    splits = manifest["splits"]
    digest = hashlib.sha256(" ".join(shard["sha256"] for split in splits.values() for shard in split["shards"])
                            .encode()).hexdigest()[:16]
    store.log_dataset(run_id, manifest["name"], digest, dataset_dir,
                      {f"{split}_tokens": entry["tokens"] for split, entry in splits.items()})


@contextlib.contextmanager
def _signals_held():
    """A second Ctrl-C or SIGTERM (a sweep's controller forwards one) waits until the run is closed."""
    held = {}
    with contextlib.suppress(ValueError):   # only the main thread may install handlers
        held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _close_interrupted(run_dir, run_id: str, err: BaseException, log_path) -> None:
    """The run ends KILLED (a signal: Ctrl-C, SIGTERM) or FAILED with the error's first line."""
    from ..track import store
    from ..train import Interrupted
    first_line = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
    state = "KILLED" if isinstance(err, (KeyboardInterrupt, SystemExit, Interrupted)) else "FAILED"
    store.close_run(run_id, state, files=[log_path], error=first_line)
    status.write(run_dir, state=state.lower(), error=first_line)


def _evaluate(job: Job, trained) -> tuple[dict, str]:
    """lm-eval on the run's newest checkpoint, on the device it trained on."""
    from ..eval import evaluate
    spec = job.evaluation
    result = evaluate(trained.checkpoint, list(spec.tasks), list(spec.shots), batch_size=spec.batch_size,
                      limit=spec.limit, device=trained.device)
    return result.scores, result.results_json
