"""Run lm-eval on a checkpoint: offline task files, the Hub tasks from the local cache only."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from dataclasses import dataclass

from .suites import OFFLINE_TASK, reported_metric


class TaskUnavailable(ValueError):
    """A requested lm-eval task cannot be loaded here: unknown to lm-eval, or its dataset is not cached."""


@dataclass
class EvalResult:
    scores: dict[str, float]      # eval/<shots>shot/<task>/<metric>, fractions in [0, 1]; .../n, .../stderr
    results_json: str             # lm-eval's full results, one document per shot count


def binomial_stderr(accuracy: float, items: int) -> float:
    """The standard error of a mean of `items` 0/1 scores: lm-eval's closed form for a mean
    (sample std / sqrt(n)), which it leaves "N/A" when bootstrap_iters=0."""
    return math.sqrt(accuracy * (1 - accuracy) / (items - 1)) if items > 1 else float("nan")


def _uncertainty(values: dict, metric: str, items: int) -> float:
    """lm-eval's stderr of `metric` where it computed one, else the binomial one."""
    reported = values.get(f"{metric}_stderr,none")
    return float(reported) if isinstance(reported, (int, float)) else binomial_stderr(values[f"{metric},none"], items)


def offline_hub() -> None:
    """No Hub traffic during a run: datasets and huggingface_hub read these flags at import, so
    set both the variables and, where the libraries are already loaded, their constants."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if os.environ["HF_HUB_OFFLINE"] == "1":
        import datasets.config
        import huggingface_hub.constants
        datasets.config.HF_DATASETS_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True


@functools.cache
def task_manager(hub: bool):
    """lm-eval's TaskManager over the offline task's folder, and over lm-eval's own tasks only where a Hub
    task is asked for (`hub`): indexing those takes ~13 s of a CPU, which an offline evaluation skips."""
    from lm_eval.tasks import TaskManager
    from .offline_task import ensure_task_dir
    return TaskManager(include_path=str(ensure_task_dir()), include_defaults=hub)


def known_task_names() -> list[str]:
    """The task names of the installed lm-eval, kept per version in the user's cache (every home reuses
    them, and none is written to): indexing lm-eval's task files takes seconds, which a dry run should
    not spend every time. An unwritable cache is only slower."""
    from importlib.metadata import version

    from .. import paths
    cache = paths.user_cache_dir() / f"lm_eval-{version('lm_eval')}-task-names.json"
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        from lm_eval.tasks import TaskManager
        names = sorted(TaskManager().all_tasks)            # lm-eval's own, without a home's offline task
        with contextlib.suppress(OSError):
            cache.parent.mkdir(parents=True, exist_ok=True)
            paths.write_atomic(cache, json.dumps(names))
        return names


def check_known(tasks: list[str], names: list[str]) -> None:
    """A misspelt task is one line naming it and the nearest names lm-eval knows."""
    import difflib
    for task in tasks:
        if task not in names:
            near = difflib.get_close_matches(task, names, n=3)
            raise TaskUnavailable(f"eval.tasks={task!r}: not an lm-eval task" + (f"; did you mean {', '.join(near)}?"
                                                                                  if near else ""))


def check_tasks(tasks) -> None:
    """Every task name is one lm-eval knows, checked before anything trains (indexing lm-eval's tasks
    takes seconds, so the offline task, always known, skips it)."""
    hub_tasks = [t for t in tasks if t != OFFLINE_TASK]
    if hub_tasks:
        check_known(hub_tasks, known_task_names())


def load_tasks(tasks: list[str], manager):
    """Load every task up front from local files / the HF cache; a missing one is one clear line.

    ddl never downloads during a run (cluster nodes are often offline and a hung download wastes
    the allocation): `ddl-eval download` fills the cache on a connected machine.
    """
    check_known(tasks, manager.all_tasks)
    loaded = {}
    for task in tasks:
        try:
            loaded.update(manager.load([task])["tasks"])
        except Exception as err:
            raise TaskUnavailable(
                f"eval.tasks={task!r}: its dataset is not in the Hugging Face cache ({type(err).__name__}); on a "
                f"connected machine run `ddl-eval download --tasks {task}` (same HF_HOME), then re-run; "
                f"offline tasks: {OFFLINE_TASK}") from None
    return loaded


def evaluate(model_or_checkpoint, tasks: list[str], shots: list[int], *, tokenizer=None, batch_size: int = 16,
             limit: int | None = None, device: str = "cpu") -> EvalResult:
    offline_hub()
    import lm_eval
    from .adapter import DDLLM

    manager = task_manager(hub=any(task != OFFLINE_TASK for task in tasks))
    load_tasks(tasks, manager)  # fail fast, before any model work
    if isinstance(model_or_checkpoint, (str, os.PathLike)):
        lm = DDLLM(checkpoint=str(model_or_checkpoint), batch_size=batch_size, device=device)
    else:
        lm = DDLLM(model=model_or_checkpoint, tokenizer=tokenizer, batch_size=batch_size, device=device)
    scores, documents = {}, {}
    for k in shots:
        out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), num_fewshot=k, task_manager=manager, limit=limit,
                                      log_samples=False, bootstrap_iters=0, random_seed=0, numpy_random_seed=0,
                                      torch_random_seed=0, fewshot_random_seed=0)
        for task, values in out["results"].items():
            for key, value in values.items():
                metric, _, filt = key.partition(",")
                if filt == "none" and metric in ("acc", "acc_norm") and isinstance(value, (int, float)):
                    scores[f"eval/{k}shot/{task}/{metric}"] = float(value)
            metric, prefix = reported_metric(task), f"eval/{k}shot/{task}"
            if f"{prefix}/{metric}" in scores:
                scores[f"{prefix}/reported"] = scores[f"{prefix}/{metric}"]
                items = out.get("n-samples", {}).get(task, {}).get("effective")   # groups have none
                if items:
                    scores.update({f"{prefix}/n": float(items),
                                   f"{prefix}/stderr": _uncertainty(values, metric, items)})
        documents[f"{k}shot"] = {key: out[key] for key in ("results", "configs", "versions", "n-shot", "n-samples",
                                                           "config") if key in out}
    return EvalResult(scores, json.dumps(documents, indent=1, default=str))
