"""Corpora, tokenizers and token shards. `DataConfig` imports no torch (dry runs use it)."""

from .config import SOURCES, TOKENIZERS, DataConfig

__all__ = ["SOURCES", "TOKENIZERS", "DataConfig", "prepare", "open_dataset", "TokenDataset",
           "BatchLoader", "val_batches"]


def __getattr__(name):  # the heavy parts load on first use
    if name in ("prepare", "open_dataset", "TokenDataset"):
        from . import dataset
        return getattr(dataset, name)
    if name in ("BatchLoader", "val_batches"):
        from . import loader
        return getattr(loader, name)
    raise AttributeError(name)
