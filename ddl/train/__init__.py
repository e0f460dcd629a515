"""One run from its resolved config to its final validation loss (no mlflow, no hydra here)."""

from .config import RunConfig, TrainConfig

__all__ = ["RunConfig", "TrainConfig", "train", "Trainer", "RunResult", "NonFiniteLoss", "Interrupted", "Pruned",
           "load_checkpoint_model", "MetricLogger", "ConsoleLogger", "JsonlLogger", "MultiLogger"]


def __getattr__(name):  # torch loads on first use, so configs stay cheap to import
    if name in ("train", "Trainer", "RunResult", "NonFiniteLoss", "Interrupted", "Pruned"):
        from . import loop
        return getattr(loop, name)
    if name == "load_checkpoint_model":
        from .checkpoint import load_checkpoint_model
        return load_checkpoint_model
    if name in ("MetricLogger", "ConsoleLogger", "JsonlLogger", "MultiLogger"):
        from . import loggers
        return getattr(loggers, name)
    raise AttributeError(name)
