"""`ddl-eval`: evaluate a finished run (or any checkpoint) later, or pre-download task datasets.

    ddl-eval <signature | run dir | checkpoint.pt> [--tasks ...] [--shots 0 1] [--limit N]
    ddl-eval download [--tasks ...]      # on a connected machine: fill the Hugging Face cache
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .. import paths
from .suites import OFFLINE_TASK, PAPER_TASKS


def _resolve(target: str) -> Path:
    path = Path(target)
    if path.exists():
        return path
    if (paths.runs_dir() / target).is_dir():
        return paths.runs_dir() / target
    raise ValueError(f"run={target!r}: not a checkpoint, a run directory, or a signature under {paths.runs_dir()}")


def _download(tasks: list[str]) -> int:
    os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "0"
    from lm_eval.tasks import TaskManager, get_task_dict
    get_task_dict(tasks, TaskManager())
    print(f"cached: {', '.join(tasks)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddl-eval", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("target", help="run signature, run directory, checkpoint file, or 'download'")
    parser.add_argument("--tasks", nargs="+", default=[OFFLINE_TASK], help=f"lm-eval tasks (paper: {' '.join(PAPER_TASKS)})")
    parser.add_argument("--shots", nargs="+", type=int, default=[0])
    parser.add_argument("--limit", type=int, default=None, help="items per task (smoke checks)")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    if args.target == "download":
        return _download(args.tasks)
    from .harness import evaluate
    try:
        target = _resolve(args.target)
        result = evaluate(target, args.tasks, args.shots, batch_size=args.batch_size, limit=args.limit)
    except ValueError as err:
        print(f"ddl-eval: error: {err}")
        return 2
    for key, value in sorted(result.scores.items()):
        print(f"{key:<48} {value:.4f}")
    from ..train.checkpoint import load_checkpoint_model
    from ..track import store
    signature = load_checkpoint_model(target)[1]["signature"]
    logged = store.log_evaluation(signature, result.scores, result.results_json)
    print(f"logged to MLflow run(s): {', '.join(logged)}" if logged else "no MLflow run has this signature; not logged")
    return 0
