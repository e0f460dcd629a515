"""The task every job runs (in-process for `ddl-run`, in a submitit worker for `ddl-run -m`).

config -> RunConfig -> skip if finished -> MLflow run (resumed by signature) -> train (resumes
from its own checkpoint) -> optional lm-eval -> FINISHED, or FAILED with the error's first line.
Only rank 0 talks to MLflow and writes status; every rank trains.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess

from omegaconf import DictConfig, OmegaConf

from .. import paths
from . import status
from .configs import ConfigError
from .spec import Job


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
    """Export torch.distributed's environment from submitit's when a job has several tasks."""
    try:
        import submitit
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a submitit job
        return "none"
    if env.num_tasks > 1:
        port = 20000 + int("".join(c for c in str(env.job_id) if c.isdigit())[-4:] or 0) % 20000
        os.environ.update(RANK=str(env.global_rank), LOCAL_RANK=str(env.local_rank), WORLD_SIZE=str(env.num_tasks),
                          MASTER_ADDR=env.hostnames[0], MASTER_PORT=str(port))
    return env.cluster


def _tags(job: Job, launcher: str) -> dict:
    import torch
    commit, dirty = _git()
    tokenizer = job.run.data.tokenizer
    return {"ddl.sweep": job.experiment, "ddl.git_commit": commit, "ddl.git_dirty": dirty, "ddl.launcher": launcher,
            "ddl.slurm_job_id": os.environ.get("SLURM_JOB_ID", ""), "ddl.host": socket.gethostname(),
            "ddl.torch": torch.__version__, "ddl.cuda": str(torch.version.cuda), "ddl.python": platform.python_version(),
            "ddl.tokenizer": tokenizer, "ddl.loss_unit": f"nats/token ({tokenizer})", "ddl.row": job.name.split("-")[0]}


def run_task(cfg: DictConfig) -> dict:
    job = Job.from_config(cfg)
    signature, run_dir = job.signature, paths.runs_dir() / job.signature
    launcher = _join_submitit_ddp()
    is_main = os.environ.get("RANK", "0") == "0"
    evaluations = job.evaluation.evaluations()
    done = status.finished_in(run_dir, job.experiment, evaluations)
    if done:
        print(f"{job.name} [{signature}]: already finished in '{job.experiment}' (MLflow run {done['run_id']}); skipped")
        return {"signature": signature, "status": "skipped", **done}

    from ..train import ConsoleLogger, MultiLogger, train
    from ..track import store

    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = None
    if is_main:
        try:
            run_id = store.open_run(job.experiment, signature, job.name, job.params(), _tags(job, launcher))
        except ValueError as err:   # a deleted experiment
            raise ConfigError(str(err)) from None
        status.write(run_dir, state="running", name=job.name, run_id=run_id, error=None)
    log_path = run_dir / "train.log"
    with open(log_path, "a", encoding="utf-8") as log_file:
        loggers = [ConsoleLogger(), ConsoleLogger(log_file)]
        if is_main:
            loggers += [store.MLflowLogger(run_id), status.StatusLogger(run_dir, job.run.train.steps)]
        logger = MultiLogger(*loggers)
        try:
            result = train(job.run, run_dir, logger, signature)
            logger.close()
            final = dict(result.final)
            summary = {f"final/{k}": v for k, v in final.items()}   # the report's numbers
            texts = {"config.yaml": OmegaConf.to_yaml(cfg, resolve=True)}
            eval_error, evaluated = None, []
            if is_main and result.resumed_from:     # trained (partly) under another experiment's run
                store.inherit_history(run_id, signature, result.resumed_from)
            if evaluations and is_main:
                try:
                    scores, results_json = _evaluate(job, result)
                except Exception as err:  # the training results stand; evaluate later with ddl-eval
                    reason = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
                    eval_error = f"{reason} -- then: ddl-eval {signature} --tasks {' '.join(job.evaluation.tasks)}"
                    print(f"{job.name} [{signature}]: evaluation skipped: {eval_error}")
                else:
                    final.update(scores)
                    summary.update(scores)
                    texts["eval_results.json"] = results_json
                    evaluated = evaluations
            if is_main:
                if eval_error:
                    store.client().set_tag(run_id, store.EVAL_ERROR_TAG, eval_error[:5000])
                import json
                texts["final_metrics.json"] = json.dumps(final, indent=1)
                store.close_run(run_id, "FINISHED", metrics=summary, texts=texts, files=[log_path])
                status.mark_done(run_dir, job.experiment, {"run_id": run_id, "final": final, "evaluations": evaluated})
                status.write(run_dir, state="finished", **{"val_loss": final.get("val/loss")})
            print(f"{job.name} [{signature}]: val/loss {final['val/loss']:.4f}  ({result.steps} steps, {result.seconds:.0f} s)")
            return {"signature": signature, "status": "finished", "run_id": run_id, "final": final}
        except BaseException as err:
            logger.close()
            requeued = isinstance(err, SystemExit)  # submitit requeues after our checkpoint: the run goes on
            if is_main and not requeued:
                first_line = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip(": ")
                state = "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED"
                store.close_run(run_id, state, files=[log_path], error=first_line)
                status.write(run_dir, state=state.lower(), error=first_line)
            raise


def _evaluate(job: Job, trained) -> tuple[dict, str]:
    """lm-eval on the run's newest checkpoint, on the device it trained on."""
    from ..eval import evaluate
    spec = job.evaluation
    result = evaluate(trained.checkpoint, list(spec.tasks), list(spec.shots), batch_size=spec.batch_size,
                      limit=spec.limit, device=trained.device)
    return result.scores, result.results_json
