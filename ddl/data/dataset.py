"""Token datasets on disk: uint16 shards + manifest.json, built by `prepare`, read by `open_dataset`.

    <root>/<name>/manifest.json     written last: its presence marks the dataset finished
    <root>/<name>/train_0000.bin    raw uint16 tokens, documents separated by the tokenizer's eot
    <root>/<name>/val_0000.bin
    <root>/<name>/tokenizer.json    (bpe only)

`prepare` builds into `<name>.partial/` under a lock that holds on any shared disk (ddl.locks), records its
progress after every flushed shard and, between shards, about every second with the next shards' tokens so far
(`pending_<split>.tokens`), so an interrupted prepare resumes there; it renames the directory
at the end. A resume is of the same source: the build records its fingerprint (each file's path,
size and mtime, or the Hub revision, and the unit size), and one whose source changed starts
afresh; the manifest keeps the fingerprint's digest.
Its workers tokenize the source's units in parallel (ddl.data.parallel); the parent writes the
documents in the source's order, so the shards and the manifest are the same bytes whatever the
number of workers, and whether or not the build was interrupted.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .. import paths
from ..cpus import cpu_threads
from ..locks import exclusive
from ..validation import is_int
from .config import DataConfig
from .parallel import tokenized
from .progress import Meter
from .sources import documents, fingerprint, is_val, units, what_changed
from .tokenizers import BPETokenizer, Tokenizer, load_tokenizer

FORMAT = 1
MANIFEST = "manifest.json"
PROGRESS = "progress.json"
VERIFIED = "verified.json"   # shard -> (size, mtime) whose sha256 matched the manifest's
SOURCE = "source.json"       # an unfinished build's source fingerprint (ddl.data.sources.fingerprint)
SHARD_TOKENS = 1 << 24  # 32 MiB of uint16 per shard
RECORD_EVERY_S = 1.0    # between two flushes, the position and the buffers are saved at most this often
SPLITS = ("train", "val")
BPE_BYTES_PER_TOKEN = 4   # about what a BPE token of English text holds


def _write_json(path: Path, obj) -> None:
    paths.write_atomic(path, json.dumps(obj, indent=1, sort_keys=True), durable=True)


class _SplitWriter:
    """A split's shards, and its buffer of the next one: saved as it grows to `pending_<split>.tokens` (the
    first `kept` tokens of which an interrupted build had recorded)."""

    def __init__(self, work: Path, split: str, state: dict, kept: int = 0):
        self.work, self.split, self.state = work, split, state  # state: shards, tokens, bytes, docs
        self.pending = work / f"pending_{split}.tokens"
        if self.pending.exists():
            os.truncate(self.pending, 2 * kept)                 # what a kill appended after the record goes
        self.buffer: list[np.ndarray] = [np.fromfile(self.pending, np.uint16)] if kept else []
        self.buffered, self.saved = kept, len(self.buffer)      # tokens; buffer entries in the pending file

    def save(self) -> int:
        """The buffer's entries not yet in the pending file appended to it, fsynced; the tokens it then holds."""
        if self.saved < len(self.buffer):
            with open(self.pending, "ab") as file:
                for tokens in self.buffer[self.saved:]:
                    file.write(tokens.tobytes())
                file.flush()
                os.fsync(file.fileno())
            self.saved = len(self.buffer)
        return self.buffered

    def add(self, tokens: np.ndarray, n_bytes: int, docs: int) -> None:
        """Whole documents' tokens (each's eot included), their UTF-8 bytes and their count."""
        self.buffer.append(tokens)
        self.buffered += len(tokens)
        self.state["bytes"] += n_bytes
        self.state["docs"] += docs

    def flush(self) -> None:
        if not self.buffered:
            return
        tokens = np.concatenate(self.buffer)
        name = f"{self.split}_{len(self.state['shards']):04d}.bin"
        paths.write_atomic(self.work / name, tokens.tobytes(), durable=True)
        self.state["shards"].append({"file": name, "tokens": int(tokens.size),
                                     "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()})
        self.state["tokens"] += int(tokens.size)
        self.buffer, self.buffered, self.saved = [], 0, 0      # the pending file goes once this is recorded


def _tokenizer_for(cfg: DataConfig, work: Path) -> Tokenizer:
    if cfg.tokenizer == "bpe" and not (work / BPETokenizer.FILE).is_file():
        train_docs = (d for d in documents(cfg) if not is_val(d, cfg.val_fraction))
        if cfg.source == "fineweb_edu":   # a stream: train on about the text the token budget keeps
            train_docs = within_bytes(train_docs, BPE_BYTES_PER_TOKEN * cfg.fineweb_tokens)
        return BPETokenizer.train(train_docs, cfg.bpe_vocab, work / BPETokenizer.FILE)
    return load_tokenizer(cfg.tokenizer, work)


def within_bytes(docs: Iterable[str], limit: int) -> Iterator[str]:
    """The documents until `limit` UTF-8 bytes have gone by."""
    seen = 0
    for doc in docs:
        if seen >= limit:
            return
        seen += len(doc.encode("utf-8"))
        yield doc


def _progress(work: Path) -> dict:
    """Where an interrupted build stopped: after `docs_done` documents, the first `unit_docs` of unit `unit`
    (shards flushed up to there, the next ones' first `pending` tokens saved); a fresh state when there is
    none, or one of an older layout. A shard written after the last record, or a temp file a kill left,
    goes: it is written again."""
    path = work / PROGRESS
    state = json.loads(path.read_text()) if path.is_file() else {}
    if "unit" not in state:
        state = {"docs_done": 0, "unit": 0, "unit_docs": 0, "finished": False, "pending": {s: 0 for s in SPLITS},
                 **{s: {"shards": [], "tokens": 0, "bytes": 0, "docs": 0} for s in SPLITS}}
    recorded = {shard["file"] for s in SPLITS for shard in state[s]["shards"]}
    for stale in [*work.glob("*.bin"), *work.glob(".*.tmp")]:
        if stale.name not in recorded:
            stale.unlink()
    return state


class _Build:
    """One build of a dataset into `work`, resumed where progress.json says: the source's documents go to the
    shards in its order, both splits flushed together as soon as train's buffer reaches SHARD_TOKENS. The
    position (unit, documents of it) is recorded with each flush and, between them, at most every
    RECORD_EVERY_S after a unit, with the buffers saved: a kill loses at most that much work."""

    def __init__(self, cfg: DataConfig, work: Path, source: Iterable):
        self.cfg, self.work, self.source = cfg, work, source
        self.state = _progress(work)
        kept = self.state.get("pending", {})
        self.writers = {s: _SplitWriter(work, s, self.state[s], kept.get(s, 0)) for s in SPLITS}
        self.budget = cfg.fineweb_tokens if cfg.source == "fineweb_edu" else None

    @property
    def written(self) -> int:
        return sum(self.state[s]["tokens"] + self.writers[s].buffered for s in SPLITS)

    def record(self, unit: int, unit_docs: int) -> None:
        """The position, with the buffers' tokens saved first (their count recorded)."""
        self.state["pending"] = {s: writer.save() for s, writer in self.writers.items()}
        self.state["unit"], self.state["unit_docs"] = unit, unit_docs
        _write_json(self.work / PROGRESS, self.state)

    def checkpoint(self, unit: int, unit_docs: int) -> None:
        for writer in self.writers.values():
            writer.flush()
        self.record(unit, unit_docs)
        for writer in self.writers.values():
            writer.pending.unlink(missing_ok=True)

    def run(self, workers: int, progress: bool) -> dict:
        tokenizer = _tokenizer_for(self.cfg, self.work)
        state, name = self.state, self.cfg.dataset_name()
        if not state["finished"]:
            source = self.source
            left = source[state["unit"]:] if isinstance(source, list) else None
            workers = min(workers, max(1, len(left))) if left is not None else workers
            meter = Meter(name, workers, self.written, self.budget,
                          None if left is None else sum(u.size for u in left), progress)
            if self.written and progress:
                print(f"resuming {name} at document {state['docs_done']:,} ({self.written:,} tokens written)",
                      file=sys.stderr, flush=True)
            try:
                self.tokenize(source, workers, meter)
            except BaseException:
                meter.abort()
                raise
            meter.close()
            state["finished"] = True      # a build killed before its rename adds nothing when it resumes
            _write_json(self.work / PROGRESS, state)
        for split in SPLITS:
            if not state[split]["tokens"]:
                raise ValueError(f"data.source={self.cfg.source!r}: the {split} split came out empty "
                                 f"({state['docs_done']} documents); give it more text")
        return {"tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size, "eot": tokenizer.eot},
                "splits": {s: state[s] for s in SPLITS}}

    def tokenize(self, source, workers: int, meter: Meter) -> None:
        """Every document after the recorded position, in order, to its split's writer (until the budget)."""
        first, skip = self.state["unit"], self.state["unit_docs"]
        position, recorded = (first, skip), time.monotonic()
        with contextlib.closing(tokenized(itertools.islice(source, first, None), self.cfg, self.work,
                                          workers)) as chunks:
            for index, chunk in enumerate(chunks, start=first):
                stop = self.add(chunk, index, skip if index == first else 0)
                position = (index, stop) if stop is not None else (index + 1, 0)
                meter.update(self.written, chunk.size)
                if stop is not None:
                    break
                if time.monotonic() - recorded >= RECORD_EVERY_S:
                    self.record(*position)
                    recorded = time.monotonic()
        self.checkpoint(*position)

    def add(self, chunk, index: int, doc: int) -> int | None:
        """The chunk's documents from `doc` on, in order, each to its split: in runs of whole documents up to
        the next one that fills train's shard (then both splits flushed) or reaches the budget (where it stops:
        the documents of the chunk taken, returned). The same boundaries as adding one document at a time."""
        ends = np.cumsum(chunk.lengths)
        train = self.writers["train"]
        while doc < len(ends):
            rest = slice(doc, len(ends))
            full = train.buffered + np.cumsum(np.where(chunk.val[rest], 0, chunk.lengths[rest])) >= SHARD_TOKENS
            if self.budget is not None:
                full |= self.written + np.cumsum(chunk.lengths[rest]) >= self.budget
            last = doc + (int(np.argmax(full)) if full.any() else len(full) - 1)
            self.add_run(chunk, ends, doc, last + 1)
            if train.buffered >= SHARD_TOKENS:
                self.checkpoint(index, last + 1)
            if self.budget is not None and self.written >= self.budget:
                return last + 1
            doc = last + 1
        return None

    def add_run(self, chunk, ends: np.ndarray, first: int, stop: int) -> None:
        """Documents [first, stop) of the chunk to their splits' writers."""
        tokens = chunk.tokens[ends[first] - chunk.lengths[first]:ends[stop - 1]]
        held_out = np.repeat(chunk.val[first:stop], chunk.lengths[first:stop])
        for split, docs, mask in (("train", ~chunk.val[first:stop], ~held_out), ("val", chunk.val[first:stop],
                                                                                 held_out)):
            if docs.any():
                self.writers[split].add(tokens[mask], int(chunk.n_bytes[first:stop][docs].sum()), int(docs.sum()))
        self.state["docs_done"] += stop - first


def prepare(cfg: DataConfig, root: Path | None = None, force: bool = False, progress: bool = True,
            workers: int | None = None) -> Path:
    """Build the dataset for `cfg` (resumably) with `workers` processes (default: the CPUs this process may
    use), or return it when it is already finished."""
    root = Path(root) if root is not None else paths.data_dir()
    name = cfg.dataset_name()
    final, work, lock = root / name, root / f"{name}.partial", root / f"{name}.lock"
    try:
        return _prepare_locked(cfg, final, work, lock, force, progress, workers)
    except ValueError:
        paths.prune(root)                   # a refused build leaves no folder (its lock released first)
        raise


def _prepare_locked(cfg: DataConfig, final: Path, work: Path, lock: Path, force: bool, progress: bool,
                    workers: int | None) -> Path:
    name = cfg.dataset_name()
    with exclusive(lock):
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
            source = units(cfg)
            source_fingerprint = _same_source(work, fingerprint(cfg, source), name)
            built = _Build(cfg, work, source).run(workers or cpu_threads(), progress)
        except ValueError:          # bad input: nothing worth resuming, nothing left
            if fresh:
                shutil.rmtree(work)
                lock.unlink(missing_ok=True)
            raise
        manifest = {     # no date, no worker count: the same bytes however and whenever it was built
            "format": FORMAT, "name": name, "dtype": "uint16", "source": cfg.source_params(), **built,
            "fingerprint": source_fingerprint,
            "bytes_per_token": {s: built["splits"][s]["bytes"] / built["splits"][s]["tokens"] for s in SPLITS},
        }
        manifest["unigram_xent_val"] = _unigram_cross_entropy(work, manifest)
        (work / PROGRESS).unlink()
        (work / SOURCE).unlink()
        _write_json(work / MANIFEST, manifest)
        os.replace(work, final)
    return final


def _same_source(work: Path, found: dict, name: str) -> dict:
    """The build in `work` is of the source `found` (its fingerprint): an interrupted build of another (a file added
    to the glob, one changed, another unit size) starts afresh, saying what changed, rather than splice the two.
    Returns what the manifest records of it: the fingerprint's digest, its file count and unit size."""
    path, recorded = work / SOURCE, None
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads(path.read_text())
    if recorded != found and any(work.iterdir()):
        print(f"ddl-data: {name}: {what_changed(recorded, found)} since its interrupted build; building it afresh",
              file=sys.stderr, flush=True)
        for stale in list(work.iterdir()):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    if recorded != found:
        _write_json(path, found)
    digest = hashlib.sha256(json.dumps(found, sort_keys=True).encode()).hexdigest()
    return {"sha256": digest, "files": len(found.get("files", [])), "unit_bytes": found["unit_bytes"],
            **({"revision": found["revision"]} if "revision" in found else {})}


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
