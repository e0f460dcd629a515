"""Evaluation through lm-evaluation-harness: the only package that imports lm_eval (lazily)."""

from .suites import OFFLINE_TASK, PAPER_TASKS, REPORTED_METRIC, reported_metric

__all__ = ["OFFLINE_TASK", "PAPER_TASKS", "REPORTED_METRIC", "reported_metric", "evaluate", "EvalResult",
           "TaskUnavailable"]


def __getattr__(name):
    if name in ("evaluate", "EvalResult", "TaskUnavailable"):
        from . import harness as module
        return getattr(module, name)
    raise AttributeError(name)
