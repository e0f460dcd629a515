"""Token datasets on disk: uint16 shards + manifest.json, built by `prepare`, read by `open_dataset`.

    <root>/<name>/manifest.json     written last: its presence marks the dataset finished
    <root>/<name>/train_0000.bin    raw uint16 tokens, documents separated by the tokenizer's eot
    <root>/<name>/val_0000.bin
    <root>/<name>/tokenizer.json    (bpe only)

`prepare` builds into `<name>.partial/` under a file lock, records its progress after every
flushed shard (so an interrupted prepare resumes there), and renames the directory at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .. import paths
from ..validation import is_int
from .config import DataConfig
from .sources import documents, is_val
from .tokenizers import BPETokenizer, Tokenizer, load_tokenizer

FORMAT = 1
MANIFEST = "manifest.json"
PROGRESS = "progress.json"
VERIFIED = "verified.json"   # shard -> (size, mtime) whose sha256 matched the manifest's
SHARD_TOKENS = 1 << 24  # 32 MiB of uint16 per shard
SPLITS = ("train", "val")
BPE_BYTES_PER_TOKEN = 4   # about what a BPE token of English text holds


def _write_json(path: Path, obj) -> None:
    paths.write_atomic(path, json.dumps(obj, indent=1, sort_keys=True), durable=True)


@contextlib.contextmanager
def _locked(path: Path):
    """An flock on `path`, whose holder may remove it and its folder (a refused build leaves nothing): a
    waiter that then gets the lock of the removed file locks the path's new one instead."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            handle = open(path, "a")
        except FileNotFoundError:     # the folder, empty, was removed between the two
            continue
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                if _still_named(handle, path):
                    yield
                    return
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _still_named(handle, path: Path) -> bool:
    """Whether `path` is still the open file (not a new one beside a removed one, nor none)."""
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


class _SplitWriter:
    def __init__(self, work: Path, split: str, state: dict):
        self.work, self.split, self.state = work, split, state  # state: shards, tokens, bytes, docs
        self.buffer: list[np.ndarray] = []
        self.buffered = 0

    def add(self, ids: list[int], eot: int, n_bytes: int) -> None:
        self.buffer.append(np.asarray(ids + [eot], dtype=np.uint16))
        self.buffered += len(ids) + 1
        self.state["bytes"] += n_bytes
        self.state["docs"] += 1

    def flush(self) -> None:
        if not self.buffered:
            return
        tokens = np.concatenate(self.buffer)
        name = f"{self.split}_{len(self.state['shards']):04d}.bin"
        paths.write_atomic(self.work / name, tokens.tobytes(), durable=True)
        self.state["shards"].append({"file": name, "tokens": int(tokens.size),
                                     "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()})
        self.state["tokens"] += int(tokens.size)
        self.buffer, self.buffered = [], 0


def _tokenizer_for(cfg: DataConfig, work: Path) -> Tokenizer:
    if cfg.tokenizer == "bpe" and not (work / BPETokenizer.FILE).is_file():
        train_docs = (d for d in documents(cfg) if not is_val(d, cfg.val_fraction))
        if cfg.source == "fineweb_edu":   # a stream: train on about the text the token budget keeps
            train_docs = _within_bytes(train_docs, BPE_BYTES_PER_TOKEN * cfg.fineweb_tokens)
        return BPETokenizer.train(train_docs, cfg.bpe_vocab, work / BPETokenizer.FILE)
    return load_tokenizer(cfg.tokenizer, work)


def _within_bytes(docs: Iterable[str], limit: int) -> Iterator[str]:
    """The documents until `limit` UTF-8 bytes have gone by."""
    seen = 0
    for doc in docs:
        if seen >= limit:
            return
        seen += len(doc.encode("utf-8"))
        yield doc


def _build(cfg: DataConfig, work: Path, progress: bool) -> dict:
    from tqdm import tqdm

    tokenizer = _tokenizer_for(cfg, work)
    progress_path = work / PROGRESS
    state = json.loads(progress_path.read_text()) if progress_path.is_file() else {
        "docs_done": 0, **{s: {"shards": [], "tokens": 0, "bytes": 0, "docs": 0} for s in SPLITS}}
    writers = {s: _SplitWriter(work, s, state[s]) for s in SPLITS}
    budget = cfg.fineweb_tokens if cfg.source == "fineweb_edu" else None
    bar = tqdm(desc=f"tokenizing {cfg.dataset_name()}", unit="tok", unit_scale=True, disable=not progress,
               initial=state["train"]["tokens"] + state["val"]["tokens"])

    def checkpoint() -> None:  # flush both splits together so docs_done is exact
        for writer in writers.values():
            writer.flush()
        _write_json(progress_path, state)

    try:
        for doc in itertools.islice(documents(cfg), state["docs_done"], None):
            split = "val" if is_val(doc, cfg.val_fraction) else "train"
            ids = tokenizer.encode(doc)
            writers[split].add(ids, tokenizer.eot, len(doc.encode("utf-8")))
            state["docs_done"] += 1
            bar.update(len(ids) + 1)
            if writers["train"].buffered >= SHARD_TOKENS:
                checkpoint()
            written = sum(state[s]["tokens"] + writers[s].buffered for s in SPLITS)
            if budget is not None and written >= budget:
                break
        checkpoint()
    finally:
        bar.close()         # ends the bar's line: an error is a line of its own
    for split in SPLITS:
        if not state[split]["tokens"]:
            raise ValueError(f"data.source={cfg.source!r}: the {split} split came out empty "
                             f"({state['docs_done']} documents); give it more text")
    return {"tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size, "eot": tokenizer.eot},
            "splits": {s: state[s] for s in SPLITS}}


def prepare(cfg: DataConfig, root: Path | None = None, force: bool = False, progress: bool = True) -> Path:
    """Build the dataset for `cfg` (resumably), or return it when it is already finished."""
    root = Path(root) if root is not None else paths.data_dir()
    name = cfg.dataset_name()
    final, work, lock = root / name, root / f"{name}.partial", root / f"{name}.lock"
    with _locked(lock):
        if (final / MANIFEST).is_file() and not force:
            return final
        if final.exists():
            if not force:
                raise ValueError(f"dataset {final}: damaged (no {MANIFEST}); "
                                 f"rebuild it with `ddl-data prepare --force`")
            shutil.rmtree(final)
        fresh = not work.exists()
        work.mkdir(exist_ok=True)
        try:
            built = _build(cfg, work, progress)
        except ValueError:          # bad input: nothing worth resuming, nothing left
            if fresh:
                shutil.rmtree(work)
                lock.unlink()
                paths.prune(root)
            raise
        manifest = {
            "format": FORMAT, "name": name, "dtype": "uint16", "created": datetime.now(timezone.utc).isoformat(),
            "source": cfg.source_params(), **built,
            "bytes_per_token": {s: built["splits"][s]["bytes"] / built["splits"][s]["tokens"] for s in SPLITS},
        }
        manifest["unigram_xent_val"] = _unigram_cross_entropy(work, manifest)
        (work / PROGRESS).unlink()
        _write_json(work / MANIFEST, manifest)
        os.replace(work, final)
    return final


class Split:
    """One split's shards as read-only memory maps."""

    def __init__(self, directory: Path, entry: dict):
        self.entry = entry
        self.shards = [np.memmap(directory / s["file"], dtype=np.uint16, mode="r") for s in entry["shards"]]
        self.tokens = int(entry["tokens"])

    def concatenated(self) -> np.ndarray:
        return np.concatenate(self.shards) if len(self.shards) > 1 else np.asarray(self.shards[0])


@dataclass
class TokenDataset:
    path: Path
    manifest: dict

    @property
    def train(self) -> Split:
        return Split(self.path, self.manifest["splits"]["train"])

    @property
    def val(self) -> Split:
        return Split(self.path, self.manifest["splits"]["val"])

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.manifest["tokenizer"]["name"], self.path)

    def verify(self, full: bool = False) -> None:
        """Every shard has its manifest's size, and its sha256 once per version of the file: a shard
        whose (size, mtime) was hashed before, in any process, is not hashed again unless `full`."""
        try:
            seen = {} if full else json.loads((self.path / VERIFIED).read_text())
        except (OSError, ValueError):
            seen = {}
        verified = {}
        for split in SPLITS:
            for shard in self.manifest["splits"][split]["shards"]:
                file = self.path / shard["file"]
                problem = f"dataset {self.path}: shard {shard['file']} is damaged"
                remedy = "rebuild it with `ddl-data prepare --force` (same source and tokenizer)"
                try:
                    stat = file.stat()
                except OSError:
                    raise ValueError(f"{problem}: missing; {remedy}") from None
                if stat.st_size != 2 * shard["tokens"]:
                    raise ValueError(f"{problem}: {stat.st_size} bytes, the manifest says {2 * shard['tokens']}; "
                                     f"{remedy}")
                version = [stat.st_size, stat.st_mtime_ns]
                if seen.get(shard["file"]) != version:
                    if hashlib.sha256(file.read_bytes()).hexdigest() != shard["sha256"]:
                        raise ValueError(f"{problem}: its sha256 is not the manifest's; {remedy}")
                verified[shard["file"]] = version
        if verified != seen:
            with contextlib.suppress(OSError):   # a read-only dataset is verified again next time
                paths.write_atomic(self.path / VERIFIED, json.dumps(verified))


_verified_in_this_process: set[Path] = set()


def open_dataset(path: Path) -> TokenDataset:
    """The finished dataset at `path`, its shards verified (once per process); one-line ValueErrors."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ValueError(f"dataset={str(path)!r}: not a finished dataset (no {MANIFEST}); run `ddl-data prepare`")
    try:
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"format {manifest.get('format')}, expected {FORMAT}")
        shards = [s for split in SPLITS for s in manifest["splits"][split]["shards"]]
        if not all(isinstance(s.get("file"), str) and "/" not in s["file"] and is_int(s.get("tokens"))
                   for s in shards):
            raise ValueError("a shard entry without its file name or token count")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"dataset={str(path)!r}: {MANIFEST} is damaged ({type(err).__name__}: {err}); "
                         f"rebuild it with `ddl-data prepare --force`") from None
    dataset = TokenDataset(path, manifest)
    if path.resolve() not in _verified_in_this_process:
        dataset.verify()
        _verified_in_this_process.add(path.resolve())
    return dataset


def _unigram_cross_entropy(directory: Path, manifest: dict) -> float:
    """Nats/token of a unigram model fitted on train (add-one smoothed), scored on val.

    The floor a language model must clearly beat to show it learned more than token frequencies.
    """
    vocab = manifest["tokenizer"]["vocab_size"]
    counts = np.zeros(vocab, dtype=np.float64)
    for shard in Split(directory, manifest["splits"]["train"]).shards:
        counts += np.bincount(shard, minlength=vocab)[:vocab]
    log_p = np.log((counts + 1) / (counts.sum() + vocab))
    val = Split(directory, manifest["splits"]["val"]).concatenated()
    return float(-log_p[val].mean())
