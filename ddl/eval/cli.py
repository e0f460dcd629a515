"""`ddl-eval`: evaluate a finished run (or any checkpoint) later, or pre-download task datasets.

    ddl-eval <signature | run dir | checkpoint.pt> [--tasks ...] [--shots 0 1] [--limit N]
    ddl-eval download [--tasks ...]      # on a connected machine: fill the Hugging Face cache
    ddl-eval import-reference <state_dict.pt> --variant ddl_dv4   # a checkpoint of the authors' code
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .. import paths
from ..validation import OneLineParser
from .suites import OFFLINE_TASK, PAPER_TASKS


def _resolve(target: str) -> Path:
    """A checkpoint file, a run folder, or a signature: its folder in this home, where a checkpoint the
    store holds (another home's run) is downloaded first."""
    path = Path(target)
    if path.exists():
        return path
    run_dir = paths.runs_dir() / target
    from ..track import store
    from ..train import checkpoint
    if checkpoint.latest(run_dir) is None and store.is_signature(target):
        from ..track import checkpoints
        checkpoints.fetch(target, lambda step: checkpoint.path_for(run_dir, step))
    if run_dir.is_dir():
        return run_dir
    raise ValueError(f"run={target!r}: not a checkpoint, a run directory, or a signature of a run in "
                     f"{paths.runs_dir()} or with a checkpoint in the store")


def _download(tasks: list[str]) -> int:
    """Fill the Hugging Face cache with the tasks' datasets (the offline task needs none)."""
    os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "0"
    from .harness import check_known, task_manager
    hub_tasks = [t for t in tasks if t != OFFLINE_TASK]
    manager = task_manager(hub=bool(hub_tasks))
    try:
        check_known(hub_tasks, manager.all_tasks)
        manager.load(hub_tasks)
    except Exception as err:
        print(f"ddl-eval: error: download of {' '.join(hub_tasks)} failed: {type(err).__name__}: {err}".splitlines()[0])
        return 1
    print(f"cached: {', '.join(hub_tasks) or 'nothing to download'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="ddl-eval", description=__doc__,
                           formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("target", help="run signature, run directory, checkpoint file, or 'download'")
    parser.add_argument("--tasks", nargs="+", default=None,
                        help=f"lm-eval tasks (default: {OFFLINE_TASK} to evaluate, the paper's {' '.join(PAPER_TASKS)} "
                             "to download)")
    parser.add_argument("--shots", nargs="+", type=int, default=[0])
    parser.add_argument("--limit", type=int, default=None, help="items per task (smoke checks)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda when available)")
    args = parser.parse_args(argv)
    if args.target == "download":
        return _download(args.tasks or list(PAPER_TASKS))
    from .config import EvalConfig
    try:   # the flags are checked as a run's eval group is
        spec = EvalConfig(tuple(args.tasks or [OFFLINE_TASK]), tuple(args.shots), args.batch_size, args.limit)
    except ValueError as err:
        print(f"ddl-eval: error: {err}")
        return 2
    import torch
    from .harness import evaluate
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    from ..track import runs, store
    try:
        target = _resolve(args.target)
        store.client()                   # a store that cannot take the scores fails before the evaluation
        result = evaluate(target, list(spec.tasks), list(spec.shots), batch_size=spec.batch_size, limit=spec.limit,
                          device=device)
    except ValueError as err:
        print(f"ddl-eval: error: {err}")
        return 2
    for key, value in sorted(result.scores.items()):
        print(f"{key:<48} {value:.4f}")
    from ..train.checkpoint import load_checkpoint_model
    signature = load_checkpoint_model(target)[1]["signature"]
    logged = runs.log_evaluation(signature, result.scores, result.results_json, paths.runs_dir() / signature)
    print(f"logged to MLflow run(s): {', '.join(logged)}" if logged else "no MLflow run has this signature; not logged")
    return 0
