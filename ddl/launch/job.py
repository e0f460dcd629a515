"""The task every job runs (in-process for `ddl-run`, in a submitit worker for `ddl-run -m`).

config -> RunConfig -> skip if finished -> MLflow run (resumed by signature) -> train (resumes
from its own checkpoint) -> optional lm-eval -> FINISHED, or FAILED with the error's first line.
Only rank 0 talks to MLflow and writes status; every rank trains.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import time

from omegaconf import DictConfig, OmegaConf

from .. import paths
from ..text import plural
from . import status
from .configs import ConfigError
from .spec import Job, row_name
from .table import ProgressLogger, progress_seconds

TRAIN = "train"     # rank 0's decision that the job trains (status.announce)


def _join_submitit_ddp() -> tuple[str, str | None]:
    """(the launcher, the key of a multi-task job: its id and attempt; None for one task), after exporting
    torch.distributed's environment (submitit's helper) when the job has several tasks."""
    try:
        import submitit
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a submitit job
        return "none", None
    if env.num_tasks == 1:
        return env.cluster, None
    # each rank keeps every GPU visible and picks cuda:LOCAL_RANK itself
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return env.cluster, f"{env.job_id}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"


def _tags(job: Job, launcher: str) -> dict:
    import torch
    commit, dirty = paths.git_state()
    tokenizer = job.run.data.tokenizer
    return {"mlflow.source.git.commit": commit, "mlflow.source.name": "ddl-run", "mlflow.source.type": "JOB",
            "ddl.sweep": job.experiment, "ddl.git_commit": commit, "ddl.git_dirty": dirty, "ddl.launcher": launcher,
            "ddl.slurm_job_id": os.environ.get("SLURM_JOB_ID", ""), "ddl.host": socket.gethostname(),
            "ddl.cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),      # the GPUs it was given
            "ddl.torch": torch.__version__, "ddl.cuda": str(torch.version.cuda),
            "ddl.python": platform.python_version(), "ddl.tokenizer": tokenizer,
            "ddl.loss_unit": f"nats/token ({tokenizer})", "ddl.row": row_name(job.run.model), **_search_tags(job)}


def _search_tags(job: Job) -> dict:
    """A search's trial or confirmation run: its search, role, number and searched values, and its parent run
    (MLflow's UI nests it there)."""
    from ..track import searches
    tuning = job.tuning
    if not tuning.search:
        return {}
    return {searches.SEARCH_TAG: tuning.search, searches.ROLE_TAG: tuning.role, searches.TRIAL_TAG: str(tuning.trial),
            searches.VALUES_TAG: json.dumps(job.searched, sort_keys=True), searches.PARENT_TAG: tuning.parent}


def run_task(cfg: DictConfig) -> dict:
    """The job's steps: claim the signature -> skip if done, reuse if done in another experiment, leave it
    when another home trains it -> set up and resume training (from the store's checkpoint when the folder
    has none) -> open its MLflow run -> train -> evaluate -> close the run. Every error before training
    starts is one line, and leaves no run. A signature another process is working on is left to it; the
    other ranks of a multi-task job follow rank 0's decision."""
    job = Job.from_config(cfg)
    progress_seconds()   # a bad DDL_PROGRESS_S is one line, before anything is written
    job.label = status.read(paths.runs_dir() / job.signature).get("label", "")   # the sweep's name for it
    launcher, job_key = _join_submitit_ddp()
    if os.environ.get("RANK", "0") != "0":
        return _follow_rank0(cfg, job, launcher, job_key)
    return _claimed(job, job_key, lambda run_dir: _run_claimed(cfg, job, run_dir, launcher, job_key))


def reuse(job: Job, found) -> dict:
    """The sweep launcher's way to reuse a job finished in another experiment (store.finished_elsewhere),
    in its own process: no job is launched for it."""
    return _claimed(job, None, lambda run_dir: _reuse(job, run_dir, found))


def _claimed(job: Job, job_key: str | None, work) -> dict:
    run_dir = paths.runs_dir() / job.signature
    try:
        with status.claim(run_dir):
            return work(run_dir)
    except status.RunningElsewhere as err:
        return _left(job, run_dir, job_key, str(err))


def _left(job: Job, run_dir, job_key: str | None, why: str) -> dict:
    print(f"{job.name} [{job.signature}]: {why}; left to it", flush=True)
    status.announce(run_dir, job_key, why)
    return {"signature": job.signature, "status": status.ELSEWHERE, "detail": why}


def _follow_rank0(cfg: DictConfig, job: Job, launcher: str, job_key: str | None) -> dict:
    """Ranks > 0 train only when rank 0 does (it holds the claim and talks to the store)."""
    run_dir = paths.runs_dir() / job.signature
    decision = status.await_decision(run_dir, job_key)
    if decision != TRAIN:
        return {"signature": job.signature, "status": status.ELSEWHERE, "detail": decision}
    trainer = _set_up(job, run_dir)
    with open(run_dir / "train.log", "a", encoding="utf-8") as log_file:
        trainer.logger = _loggers(job, run_dir, None, log_file)
        result = trainer.fit()
        trainer.logger.close()
    return {"signature": job.signature, "status": "finished", "run_id": None, "final": dict(result.final)}


def _run_claimed(cfg: DictConfig, job: Job, run_dir, launcher: str, job_key: str | None) -> dict:
    from ..track import checkpoints, store
    from ..track.logger import patience_s
    from ..train import checkpoint
    evaluations = job.evaluation.evaluations()
    try:   # a sweep's job waits a while for a server its launcher reached (restarted meanwhile)
        store.check(patience_s=0 if launcher == "none" else patience_s())
        look = store.Lookup([job.signature])          # the signature's runs, each status searched once
        done = status.finished_in(run_dir, job.signature, job.experiment, evaluations, lookup=look)
        elsewhere = None if done else store.finished_elsewhere(job.signature, job.experiment, evaluations, look)
        rival = None if done or elsewhere else store.running_elsewhere(job.signature, lookup=look) or _trial_taken(job)
        if not (done or elsewhere or rival) and checkpoint.latest(run_dir) is None:
            checkpoints.fetch(job.signature, lambda step: checkpoint.path_for(run_dir, step))
    except ValueError as err:   # the store cannot be used, a damaged journal or download
        raise ConfigError(str(err)) from None
    if done:
        return _skipped(job, run_dir, job_key, done)
    if elsewhere:
        status.announce(run_dir, job_key, status.reused(elsewhere.experiment))
        return _reuse(job, run_dir, elsewhere)
    if rival:
        return _left(job, run_dir, job_key, f"{status.ELSEWHERE} ({rival})")
    status.announce(run_dir, job_key, TRAIN)      # before the trainer's set-up, where the ranks meet
    trainer = _set_up(job, run_dir)
    run = _open_run(job, run_dir, launcher, trainer.step)
    store.settle_claim()
    opened = run.client.get_run(run.id)
    # Another home started it at the same moment, and first, or has finished it since the look above: this home
    # leaves it (a job of several tasks, whose ranks have met already, goes on).
    rival = store.running_elsewhere(job.signature, besides=opened) or _trial_taken(job, besides=opened)
    if not rival and job.tuning.role == "trial" and job_key is None:
        rival = _trial_won_elsewhere(job, run, opened)
    done = None if rival else store.finished(job.signature, job.experiment, evaluations)
    if (rival or done) and job_key is None:
        run.lose_claim(rival or f"MLflow run {done.run_id}, finished meanwhile")
        return _skipped(job, run_dir, job_key, done) if done else _left(job, run_dir, job_key,
                                                                        f"{status.ELSEWHERE} ({rival})")
    status.write(run_dir, state="running", name=job.name, run_id=run.id, reused_from=None, error=None, note=None)
    return _train(cfg, job, run_dir, run, trainer, launcher)


def _skipped(job: Job, run_dir, job_key: str | None, done) -> dict:
    """The job's signature is FINISHED in its experiment (store.Stored): nothing to train."""
    status.announce(run_dir, job_key, "finished before; skipped")
    by = f", trained by {done.trained_by}" if done.trained_by else ""
    print(f"{job.name} [{job.signature}]: already finished in '{job.experiment}' (MLflow run {done.run_id}{by}); "
          f"skipped")
    return {"signature": job.signature, "status": "skipped", "run_id": done.run_id, "final": done.final}


def _trial_taken(job: Job, besides=None) -> str | None:
    """A search's trial number is claimed like a signature (searches.trial_taken): two homes that ask the same
    number at once, with other values, train it once."""
    tuning = job.tuning
    if tuning.role != "trial":
        return None
    from ..track import searches
    return searches.trial_taken(job.experiment, tuning.search, tuning.trial, job.signature, besides)


def _trial_won_elsewhere(job: Job, run, opened) -> str | None:
    """The trial number's claim, second look (searches.trial_won_elsewhere): this run marked won, then another
    run of the number marked so."""
    from ..track import searches
    run.set_tags({searches.WON_TAG: "1"})
    return searches.trial_won_elsewhere(job.experiment, job.tuning.search, job.tuning.trial, opened)


def _train(cfg: DictConfig, job: Job, run_dir, run, trainer, launcher: str) -> dict:
    from ..train import Pruned
    log_path = run_dir / "train.log"
    with open(log_path, "a", encoding="utf-8") as log_file:
        trainer.logger = logger = _loggers(job, run_dir, run, log_file)
        trainer.stop_early = _pruner(job, run.id)
        if trainer.resumed_from is not None:      # the job's output and its log say so, once
            resumed = f"{job.name} [{job.signature}]: resumed from step {trainer.resumed_from} " \
                      f"({trainer.last_checkpoint})"
            print(resumed, flush=True)
            print(resumed, file=log_file, flush=True)
        try:
            result = trainer.fit()
            logger.close()
            outcome = Outcome(cfg, dict(result.final))
            _record(job, run_dir, run, result, outcome, log_path)
            print(f"{job.name} [{job.signature}]: val/loss {outcome.final['val/loss']:.4f}  "
                  f"({plural(result.steps, 'step')}, {result.seconds:.0f} s)")
            return {"signature": job.signature, "status": "finished", "run_id": run.id, "final": outcome.final}
        except Pruned as err:
            logger.close()
            return _close_pruned(job, run_dir, run, str(err), log_path)
        except BaseException as err:
            with _signals_held():
                _close_quietly(logger)
                if not (isinstance(err, SystemExit) and launcher == "slurm"):  # SLURM requeues it
                    _close_interrupted(run_dir, run, err, log_path)
            raise


def _pruner(job: Job, run_id: str):
    """A search's trial asks Optuna's pruner at each validation (ddl.tune.search.should_prune) against the
    search's completed trials in the store; other jobs never stop early."""
    tuning = job.tuning
    if tuning.role != "trial" or tuning.pruner == "none":
        return None
    from ..track import searches
    from ..tune.search import should_prune
    curve: dict[int, float] = {}

    def stop_early(step: int, val_loss: float) -> str | None:
        curve[step] = val_loss
        peers = [t for t in searches.runs_of(job.experiment, tuning.search, curves=True, keys=tuning.keys)
                 if t.run_id != run_id]
        if should_prune(peers, curve, job.run.train.steps, tuning, job.searched):
            return f"pruned: val/loss {val_loss:.4f} above the median of the search's completed trials there"
        return None
    return stop_early


def _close_pruned(job: Job, run_dir, run, why: str, log_path) -> dict:
    """A pruned trial ends KILLED, tagged `ddl.pruned`, its checkpoint kept: not a failure, and resumable."""
    from ..track import runs, searches
    run.set_tags({searches.PRUNED_TAG: why})
    runs.close_run(run, "KILLED", files=[log_path])
    status.write(run_dir, state="pruned", error=None)
    print(f"{job.name} [{job.signature}]: {why}", flush=True)
    return {"signature": job.signature, "status": "pruned", "run_id": run.id, "detail": why}


def _reuse(job: Job, run_dir, found) -> dict:
    """Finished in another experiment with every evaluation asked for: its run there is copied into this
    experiment (runs.copy_run) and the job is done here, without training or evaluating."""
    from ..track import runs
    source = found.experiment
    run = runs.copy_run(found.run_id, job.experiment, job.signature, job.name, job.params(),
                        {"ddl.sweep": job.experiment, "ddl.reused_from": source}, run_dir)
    steps = job.run.train.steps
    status.write(run_dir, state=status.REUSED, reused_from=source, name=job.name, label=job.label, run_id=run.id,
                 step=steps, steps=steps, val_loss=found.final.get("val/loss"), eta_s=None, error=None)
    print(f"{job.name} [{job.signature}]: {status.reused(source)}: MLflow run {run.id}, no training", flush=True)
    return {"signature": job.signature, "status": status.REUSED, "reused_from": source, "run_id": run.id,
            "final": found.final}


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


def _open_run(job: Job, run_dir, launcher: str, resume_step: int):
    """The job's MLflow run (this home's, reopened by signature when its curves end where training resumes)."""
    from ..track import runs
    try:
        return runs.open_run(job.experiment, job.signature, job.name, job.params(), _tags(job, launcher), run_dir,
                             resume_step)
    except ValueError as err:   # a deleted experiment
        raise ConfigError(str(err)) from None


def _loggers(job: Job, run_dir, run, log_file):
    """The console's progress line and train.log's step lines on every rank; MLflow and the status file on
    rank 0 (run is set there)."""
    from ..train import ConsoleLogger, MultiLogger
    loggers = [ProgressLogger(f"{job.name} [{job.signature}]", job.run.train.steps), ConsoleLogger(log_file)]
    if run is not None:
        from ..track.logger import MLflowLogger
        train = job.run.train
        loggers += [MLflowLogger(run, upload=train.checkpoint_artifact, total_steps=train.steps,
                                 note=lambda text: _note(job, run_dir, text)),
                    status.StatusLogger(run_dir, train.steps)]
    return MultiLogger(*loggers)


def _note(job: Job, run_dir, text: str) -> None:
    """What the store did meanwhile (an outage, its end): the status file's note, which the sweep's table
    shows, and the job's log."""
    status.write(run_dir, note=text)
    print(f"{job.name} [{job.signature}]: {text}", flush=True)


def _close_quietly(logger) -> None:
    """Close the loggers of a run that is ending badly; a store that cannot take the rest is one line (the
    journal in the run folder has every point)."""
    try:
        logger.close()
    except Exception as err:
        print(f"MLflow did not take the run's last points ({type(err).__name__}: {str(err).splitlines()[0]}); "
              f"they are in the run folder's journal (ddl-track sync)", flush=True)


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


def _record(job: Job, run_dir, run, result, outcome: Outcome, log_path) -> None:
    """Rank 0: inherited curves, the evaluation, then the run closed FINISHED (which is what "done" is)."""
    from ..track import runs, store
    if result.resumed_from:     # trained (partly) under another run: another experiment's, another home's
        runs.inherit_history(run, job.signature, result.resumed_from)
    _log_dataset(run, result.extra["dataset"])
    if result.checkpoint:
        run.set_tags({"ddl.checkpoint": result.checkpoint})
    if job.evaluation.evaluations():
        outcome.add_evaluation(job, result)
    if outcome.eval_error:
        run.set_tags({store.EVAL_ERROR_TAG: outcome.eval_error[:5000]})
    outcome.texts["final_metrics.json"] = json.dumps(outcome.final, indent=1)
    runs.close_run(run, "FINISHED", metrics=outcome.summary, texts=outcome.texts, files=[log_path])
    status.write(run_dir, state="finished", **{"val_loss": outcome.final.get("val/loss")})


def _log_dataset(run, dataset_dir: str) -> None:
    """The token dataset as the run's MLflow input: its name, a digest of its shards, its token counts."""
    import hashlib

    from ..data import open_dataset
    manifest = open_dataset(dataset_dir).manifest
    splits = manifest["splits"]
    digest = hashlib.sha256(" ".join(shard["sha256"] for split in splits.values() for shard in split["shards"])
                            .encode()).hexdigest()[:16]
    run.log_dataset(manifest["name"], digest, json.dumps({"uri": dataset_dir}),
                    json.dumps({f"{split}_tokens": entry["tokens"] for split, entry in splits.items()}))


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


def _close_interrupted(run_dir, run, err: BaseException, log_path) -> None:
    """The run ends KILLED (a signal: Ctrl-C, SIGTERM) or FAILED with the error's first line."""
    from ..track import runs
    from ..track.logger import StoreUnreachable
    from ..train import Interrupted
    first_line = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
    state = "KILLED" if isinstance(err, (KeyboardInterrupt, SystemExit, Interrupted)) else "FAILED"
    status.write(run_dir, state=state.lower(), error=first_line)
    if isinstance(err, StoreUnreachable):    # waited for it long enough: the journal keeps the ending
        run.journal.append("status", run.id, status=state, end_time=int(time.time() * 1000))
        return
    try:
        runs.close_run(run, state, files=[log_path], error=first_line)
    except Exception as close_err:   # the store is down: the journal has the ending, `ddl-track sync` brings it
        print(f"MLflow run {run.id} not closed ({type(close_err).__name__}); its end is in the run folder's "
              f"journal", flush=True)


def close_lost(signature: str, why: str) -> None:
    """The sweep launcher's word on a cluster job that left the queue without a result: its status says
    lost, and the MLflow run it left RUNNING ends KILLED with the reason (as a stopped job's does), so no
    one waits on its heartbeat; a re-run reopens it. A signature some process holds again is left to it."""
    from ..track import runs
    run_dir = paths.runs_dir() / signature
    with contextlib.suppress(status.RunningElsewhere), status.claim(run_dir):
        last = status.read(run_dir)
        status.write(run_dir, state=status.LOST, error=why)
        if last.get("state") != "running" or not last.get("run_id"):   # it had opened no run
            return
        try:
            run = runs.TrackedRun(last["run_id"], run_dir)
            if run.client.get_run(run.id).info.status == "RUNNING":
                runs.close_run(run, "KILLED", files=[run_dir / "train.log"], error=why)
        except Exception as err:   # the store is down: the journal has what reached it
            print(f"MLflow run {last['run_id']} not closed ({type(err).__name__}); it stays RUNNING until the sweep "
                  f"runs again", flush=True)


def _evaluate(job: Job, trained) -> tuple[dict, str]:
    """lm-eval on the run's newest checkpoint, on the device it trained on."""
    from ..eval import evaluate
    spec = job.evaluation
    result = evaluate(trained.checkpoint, list(spec.tasks), list(spec.shots), batch_size=spec.batch_size,
                      limit=spec.limit, device=trained.device)
    return result.scores, result.results_json
