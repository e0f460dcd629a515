"""Text sources: each yields documents (str) in a fixed order; a document's split is a hash of it.

The embedded default is the documentation text shipped inside CPython (`pydoc_data.topics`,
~0.47 MB of English prose and code examples from the Python reference manual: the text behind
`help('topic')`). It needs no network and no download. Topics are cut at blank lines into
documents of about 1000 characters or more (a topic's last piece may be shorter), so the
held-out split is spread over the whole manual.

`python_source` is the larger offline corpus (~55 MB): the Python source files of the
interpreter's standard library and of torch, which every machine that runs ddl has (torch is
ddl's own dependency), one document per file. Real text, mostly code with its comments and
docstrings, written by many authors over decades; large enough that a CPU study of a few million
tokens per run sees no window twice on average. Left out: test directories (some installs strip
them, so the text would differ between machines of one Python version), site-packages, and
`pydoc_data` (the embedded corpus itself, whose held-out split the offline eval task draws on).
The text depends on the Python and torch versions: both are part of the dataset's name.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import importlib.util
import itertools
import json
import os
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .config import DataConfig, is_local

MIN_DOC_CHARS = 1000
UNIT_BYTES = 1 << 20     # about the text of one worker's task: small files are grouped up to it


def is_val(doc: str, val_fraction: float) -> bool:
    """A deterministic, order-free split: the same document always lands in the same split."""
    return is_val_encoded(doc.encode("utf-8"), val_fraction)


def is_val_encoded(doc: bytes, val_fraction: float) -> bool:
    """is_val of a document already encoded as UTF-8."""
    return int.from_bytes(hashlib.sha256(doc).digest()[:8], "big") / 2 ** 64 < val_fraction


def embedded_documents() -> Iterator[str]:
    from pydoc_data.topics import topics
    for key in sorted(topics):
        chunk: list[str] = []
        for paragraph in topics[key].split("\n\n"):
            chunk.append(paragraph)
            if sum(map(len, chunk)) >= MIN_DOC_CHARS:
                yield "\n\n".join(chunk)
                chunk = []
        if chunk:
            yield "\n\n".join(chunk)


SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "pydoc_data", "__pycache__"}


def python_source_files() -> list[Path]:
    """The standard library's .py files, then torch's, each in sorted order."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(importlib.util.find_spec("torch").origin).parent]
    files = []
    for root in roots:
        files += sorted(p for p in root.rglob("*.py")
                        if p.is_file() and not SKIPPED_DIRS.intersection(p.relative_to(root).parts[:-1]))
    return files


def python_source_documents() -> Iterator[str]:
    return filter(None, map(_python_file, python_source_files()))


def _python_file(path) -> str:
    """A source file's text in its declared encoding (PEP 263, else UTF-8); "" for an undecodable file (the
    same one on every machine) or one of blanks only."""
    try:
        with tokenize.open(path) as source:
            text = source.read()
    except (SyntaxError, UnicodeDecodeError):
        return ""
    return text if text.strip() else ""


@dataclass(frozen=True)
class Unit:
    """A piece of a source that a worker reads and tokenizes by itself: its documents, in a fixed order.

    kind: `embedded` (the whole manual) | `python` (source files, a document each) | `text` (.txt files, a
    document each) | `jsonl` (a file, a document a line) | `parquet` (a file's row group, a document a row:
    a row group is read whole, so it is not cut) | `docs` (documents a stream handed the parent). `size`:
    about its bytes of text, what the ETA counts.
    """
    kind: str
    paths: tuple[str, ...] = ()
    row_group: int = 0
    docs: tuple[str, ...] = ()
    size: int = 0


def units(cfg: DataConfig) -> Iterable[Unit]:
    """The source as units, in document order: a list (its files listed, each parquet footer read, a bad file
    one ValueError naming it), or, for the Hub's stream, a generator of batches read as they are asked for."""
    if cfg.source == "embedded":
        from pydoc_data.topics import topics
        return [Unit("embedded", size=sum(map(len, topics.values())))]
    if cfg.source == "python_source":
        files = python_source_files()
        return list(_grouped("python", map(str, files), [f.stat().st_size for f in files]))
    if cfg.source == "files":
        return _file_units(cfg, "files", cfg.files, _glob(cfg.files, "files"))
    if is_local(cfg.fineweb_name):
        return _file_units(cfg, "fineweb_name", cfg.fineweb_name, _glob(_parquet_glob(cfg.fineweb_name), "fineweb_name",
                                                                           cfg.fineweb_name))
    return _streamed_units(cfg)


def fingerprint(cfg: DataConfig, listed: Iterable[Unit]) -> dict:
    """What a build's positions (unit, document) count in: the unit size, and each file's path, size and mtime
    (a listed source) or the Hub revision (a stream). A build resumed on another fingerprint would splice two
    sources (ddl.data.dataset)."""
    found: dict = {"unit_bytes": UNIT_BYTES}
    if isinstance(listed, list):
        files = sorted({path for unit in listed for path in unit.paths})
        found["files"] = [[path, stat.st_size, stat.st_mtime_ns] for path, stat in ((p, os.stat(p)) for p in files)]
    else:
        found["revision"] = cfg.fineweb_revision
    return found


def what_changed(before: dict | None, now: dict) -> str:
    """How two fingerprints differ, in words: 'its unit size changed (1048576 -> 65536 bytes)', '1 file added
    (/data/c.txt)', ..."""
    if before is None:
        return "it recorded no fingerprint of its source"
    if before.get("unit_bytes") != now["unit_bytes"]:
        return f"its unit size changed ({before.get('unit_bytes')} -> {now['unit_bytes']} bytes)"
    if before.get("revision") != now.get("revision"):
        return f"its Hub revision changed ({before.get('revision')} -> {now.get('revision')})"
    old, new = ({path: (size, mtime) for path, size, mtime in f.get("files", [])} for f in (before, now))
    changes = [(what, sorted(paths)) for what, paths in (
        ("added", new.keys() - old.keys()), ("removed", old.keys() - new.keys()),
        ("changed", {path for path in old.keys() & new.keys() if old[path] != new[path]})) if paths]
    return ", ".join(f"{len(paths)} file{'s' if len(paths) > 1 else ''} {what} ({paths[0]}"
                     f"{', ...' if len(paths) > 1 else ''})" for what, paths in changes)


def documents(cfg: DataConfig) -> Iterator[str]:
    """Every document of the source, in order (what a worker reads of each unit, one unit after another)."""
    return itertools.chain.from_iterable(read_unit(unit, cfg) for unit in units(cfg))


def read_unit(unit: Unit, cfg: DataConfig) -> Iterator[str]:
    """The unit's documents; a file that cannot be read, decoded or parsed is one ValueError naming it."""
    if unit.kind == "embedded":
        yield from embedded_documents()
        return
    if unit.kind == "docs":
        yield from unit.docs
        return
    if unit.kind == "python":
        yield from filter(None, map(_python_file, unit.paths))
        return
    key, pattern = ("files", cfg.files) if cfg.source == "files" else ("fineweb_name", cfg.fineweb_name)
    for path in unit.paths:
        with _naming(key, pattern, path):
            yield from _file_texts(unit, path, cfg)


def _glob(pattern: str, key: str, shown: str | None = None) -> list[str]:
    found = sorted(p for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    if not found:
        raise ValueError(f"data.{key}={shown or pattern!r}: matches no file")
    return found


def _parquet_glob(name: str) -> str:
    path = Path(name).expanduser()
    return str(path / "**" / "*.parquet") if path.is_dir() else str(path)


def _grouped(kind: str, paths: Iterable[str], sizes: Iterable[int]) -> Iterator[Unit]:
    """Consecutive files as units of up to UNIT_BYTES (a larger file alone)."""
    group: list[str] = []
    total = 0
    for path, size in zip(paths, sizes, strict=True):
        if group and total + size > UNIT_BYTES:
            yield Unit(kind, tuple(group), size=total)
            group, total = [], 0
        group.append(path)
        total += size
    if group:
        yield Unit(kind, tuple(group), size=total)


class _naming:
    """A file's failure (unreadable, undecodable, damaged, not what its name says) as one line naming it."""

    def __init__(self, key: str, pattern: str, path: str):
        self.prefix = f"data.{key}={pattern!r}: {path}"

    def __enter__(self):
        return self

    def __exit__(self, kind, err, _traceback):
        if isinstance(err, (OSError, ValueError)):
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err).strip()
            raise ValueError(f"{self.prefix}: {(reason.splitlines() or [kind.__name__])[0]}") from None
        return False


def _file_units(cfg: DataConfig, key: str, pattern: str, paths: list[str]) -> list[Unit]:
    """.txt files grouped, a unit per .jsonl file and per parquet row group; a parquet file's footer and
    `text` column are checked here, before any work."""
    found: list[Unit] = []
    texts: list[str] = []

    def flush_texts() -> None:
        found.extend(_grouped("text", texts, [os.stat(p).st_size for p in texts]))
        texts.clear()
    for path in paths:
        suffix = Path(path).suffix
        with _naming(key, pattern, path):
            if suffix == ".txt":
                os.stat(path)
                texts.append(path)
                continue
            flush_texts()
            if suffix in (".jsonl", ".json"):
                found.append(Unit("jsonl", (path,), size=os.stat(path).st_size))
            elif suffix == ".parquet":
                found.extend(_parquet_units(path))
            else:
                raise ValueError("not .txt, .jsonl or .parquet")
    flush_texts()
    return found


def _parquet_units(path: str) -> Iterator[Unit]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pq.ParquetFile(path)
    schema = table.schema_arrow
    if "text" not in schema.names:
        raise ValueError(f"no 'text' column (its columns: {', '.join(schema.names)})")
    kind = schema.field("text").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(f"its 'text' column holds {kind}, not strings")
    meta = table.metadata
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        size = sum(row_group.column(c).total_uncompressed_size for c in range(row_group.num_columns)
                   if row_group.column(c).path_in_schema == "text")
        yield Unit("parquet", (path,), row_group=group, size=size)


def _json_lines(path: str, cfg: DataConfig) -> Iterator[str]:
    """JSON Lines (also under a .json name): one object with a `text` field (a string, or null) per line."""
    with open(path, encoding=cfg.encoding, errors=cfg.encoding_errors) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not (isinstance(row, dict) and isinstance(row.get("text", 0), (str, type(None)))):
                raise ValueError(f"line {number}: must be JSON Lines, one object with a 'text' string per line")
            if row["text"]:
                yield row["text"]


def _file_texts(unit: Unit, path: str, cfg: DataConfig) -> Iterator[str]:
    """.txt: the file is one document; .jsonl: a row's `text` each; parquet: the row group's non-empty `text`s."""
    if unit.kind == "parquet":
        import pyarrow.parquet as pq
        yield from filter(None, pq.ParquetFile(path).read_row_group(unit.row_group, columns=["text"])
                          .column(0).to_pylist())
        return
    try:
        if unit.kind == "text":
            yield Path(path).read_text(encoding=cfg.encoding, errors=cfg.encoding_errors)
        else:
            yield from _json_lines(path, cfg)
    except UnicodeDecodeError:
        offset, undecodable = _first_undecodable(path, cfg.encoding)
        raise ValueError(f"not {cfg.encoding} at byte {offset} (0x{undecodable.hex()}); set data.encoding=<the files' "
                         f"encoding> (latin-1, cp1252, ...) or data.encoding_errors=replace (or ignore)") from None


def _first_undecodable(path: str, encoding: str) -> tuple[int, bytes]:
    """Where the file's first byte `encoding` cannot decode is, and the bytes there: a text reader's own
    error counts from the start of the chunk it was decoding."""
    decoder = codecs.getincrementaldecoder(encoding)()
    offset = 0
    with open(path, "rb") as file:
        for chunk in itertools.chain(iter(lambda: file.read(1 << 20), b""), [b""]):
            start = offset - len(decoder.getstate()[0])      # the decoder's held-back bytes come first
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                return start + err.start, err.object[err.start:err.end]
            offset += len(chunk)
    return offset, b""


def _streamed_units(cfg: DataConfig) -> Iterator[Unit]:
    """FineWeb-Edu's rows streamed from the Hub (`datasets`), as batches of about UNIT_BYTES of text."""
    try:
        from datasets import load_dataset
        rows = load_dataset(cfg.fineweb_name, name=cfg.fineweb_config, revision=cfg.fineweb_revision, split="train",
                            streaming=True)
    except Exception as err:
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"data.fineweb_name={cfg.fineweb_name!r} (config {cfg.fineweb_config!r}): cannot load it from the Hugging "
            f"Face Hub ({type(err).__name__}: {reason}); offline, pre-download it and set HF_DATASETS_OFFLINE=1, or "
            "pass local parquet files as data.fineweb_name=<glob> or data.source=files") from None
    batch: list[str] = []
    size = 0
    for row in rows:
        text = row.get("text")
        if text:
            batch.append(text)
            size += len(text)
        if size >= UNIT_BYTES:
            yield Unit("docs", docs=tuple(batch), size=size)
            batch, size = [], 0
    if batch:
        yield Unit("docs", docs=tuple(batch), size=size)
