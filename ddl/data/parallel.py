"""A source's units tokenized on N worker processes, handed back in the units' order.

Each worker reads its own units (a parquet row group, a group of files: their text never crosses a
pipe), splits and tokenizes their documents in one batched call to the tokenizer library with that
library's threads off, and sends back uint16 arrays. The parent writes the shards in unit order, so
what it writes is the same whatever N is. Workers are spawned, not forked: they inherit no lock, no
thread and no tokenizer pool of the parent's, and they end when the parent does (a kill -9 included).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .config import DataConfig
from .sources import Unit, is_val_encoded, read_unit
from .tokenizers import Tokenizer, load_tokenizer

AHEAD = 2   # units in flight per worker: one tokenizing, one waiting, while the parent writes


@dataclass
class Tokenized:
    """A unit's documents, in order."""
    tokens: np.ndarray    # uint16: every document's tokens, each followed by the eot
    lengths: np.ndarray   # int64: each document's tokens, its eot included
    val: np.ndarray       # bool: the document is held out
    n_bytes: np.ndarray   # int64: each document's UTF-8 bytes
    size: int             # the unit's Unit.size, for the ETA


def tokenize_unit(unit: Unit, cfg: DataConfig, tokenizer: Tokenizer) -> Tokenized:
    docs = list(read_unit(unit, cfg))
    encoded = [doc.encode("utf-8") for doc in docs]
    tokens, lengths = tokenizer.encode_docs(docs)
    return Tokenized(tokens, lengths, np.fromiter((is_val_encoded(b, cfg.val_fraction) for b in encoded), bool,
                                                  len(encoded)),
                     np.fromiter(map(len, encoded), np.int64, len(encoded)), unit.size)


def tokenized(units: Iterable[Unit], cfg: DataConfig, tokenizer_dir: Path, workers: int) -> Iterator[Tokenized]:
    """Each unit tokenized, in order: in this process for one worker, else on `workers` spawned processes
    with at most AHEAD units per worker in flight. A worker's error (a file that cannot be read) is raised
    here; closing the generator early (a token budget reached) cancels what has not started."""
    if workers <= 1:
        tokenizer = load_tokenizer(cfg.tokenizer, tokenizer_dir)
        with _library_threads_off():
            for unit in units:
                yield tokenize_unit(unit, cfg, tokenizer)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
                               initargs=(cfg, str(tokenizer_dir), os.getpid()))
    pending: deque = deque()
    try:
        upcoming = iter(units)
        for unit in upcoming:
            pending.append(pool.submit(_work, unit))
            if len(pending) >= AHEAD * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _library_threads_off():
    """The tokenizers library's Rust threads off for the block (it reads TOKENIZERS_PARALLELISM at each call)."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


_worker: dict = {}


def _start_worker(cfg: DataConfig, tokenizer_dir: str, parent: int) -> None:
    """A worker: one thread of tokenizing; Ctrl-C and SIGTERM left to the parent (it stops the pool, or ignores
    SIGTERM as a submitit job does until SLURM's SIGKILL), and an exit as soon as the parent is gone."""
    threading.Thread(target=_exit_without, args=(parent,), daemon=True).start()   # before the tokenizer loads
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    _worker.update(cfg=cfg, tokenizer=load_tokenizer(cfg.tokenizer, Path(tokenizer_dir)))


def _exit_without(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _work(unit: Unit) -> Tokenized:
    return tokenize_unit(unit, _worker["cfg"], _worker["tokenizer"])
