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
import sysconfig
import tokenize
from pathlib import Path
from typing import Iterator

from .config import DataConfig

MIN_DOC_CHARS = 1000


def is_val(doc: str, val_fraction: float) -> bool:
    """A deterministic, order-free split: the same document always lands in the same split."""
    bucket = int.from_bytes(hashlib.sha256(doc.encode("utf-8")).digest()[:8], "big") / 2 ** 64
    return bucket < val_fraction


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
    for path in python_source_files():
        try:
            with tokenize.open(path) as source:   # the file's declared encoding (PEP 263), else UTF-8
                text = source.read()
        except (SyntaxError, UnicodeDecodeError):   # an undecodable file: the same one on every machine
            continue
        if text.strip():
            yield text


def _rows_text(rows) -> Iterator[str]:
    for row in rows:
        text = row.get("text")
        if text:
            yield text


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


def _parquet_texts(path: str) -> Iterator[str]:
    """The non-empty values of a parquet file's `text` column, row group by row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pq.ParquetFile(path)
    schema = table.schema_arrow
    if "text" not in schema.names:
        raise ValueError(f"no 'text' column (its columns: {', '.join(schema.names)})")
    kind = schema.field("text").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(f"its 'text' column holds {kind}, not strings")
    for batch in table.iter_batches(columns=["text"]):
        yield from filter(None, batch.column(0).to_pylist())


def _one_file(path: str, cfg: DataConfig) -> Iterator[str]:
    suffix = Path(path).suffix
    if suffix == ".parquet":
        yield from _parquet_texts(path)
        return
    if suffix not in (".txt", ".jsonl", ".json"):
        raise ValueError("not .txt, .jsonl or .parquet")
    try:
        if suffix == ".txt":
            yield Path(path).read_text(encoding=cfg.encoding, errors=cfg.encoding_errors)
        else:
            yield from _json_lines(path, cfg)
    except UnicodeDecodeError:
        offset, undecodable = _first_undecodable(path, cfg.encoding)
        raise ValueError(f"not {cfg.encoding} at byte {offset} (0x{undecodable.hex()}); set data.encoding=<the files' "
                         f"encoding> (latin-1, cp1252, ...) or data.encoding_errors=replace (or ignore)") from None


def file_documents(cfg: DataConfig) -> Iterator[str]:
    """.txt: one document per file; .jsonl/.parquet: one per row's `text` field. A file that cannot be
    read, decoded or parsed stops it in one line naming the file."""
    paths = sorted(p for p in glob.glob(cfg.files, recursive=True) if Path(p).is_file())
    if not paths:
        raise ValueError(f"data.files={cfg.files!r}: matches no file")
    for path in paths:
        try:
            yield from _one_file(path, cfg)
        except (OSError, ValueError) as err:     # unreadable, undecodable, damaged, not what its name says
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err).strip()
            raise ValueError(f"data.files={cfg.files!r}: {path}: "
                             f"{(reason.splitlines() or [type(err).__name__])[0]}") from None


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


def _stream(path: str, **kwargs):
    from datasets import load_dataset
    return load_dataset(path, split="train", streaming=True, **kwargs)


def fineweb_documents(cfg: DataConfig) -> Iterator[str]:
    """FineWeb-Edu rows (`text` column), streamed. A local parquet glob takes the same path."""
    name = cfg.fineweb_name
    if name.endswith(".parquet") or Path(name).exists():
        rows = _stream("parquet", data_files=name)
    else:
        try:
            rows = _stream(name, name=cfg.fineweb_config)
        except Exception as err:
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            raise ValueError(
                f"data.fineweb_name={name!r} (config {cfg.fineweb_config!r}): cannot load it from the Hugging Face "
                f"Hub ({type(err).__name__}: {reason}); offline, pre-download it and set HF_DATASETS_OFFLINE=1, "
                "or pass local parquet files as data.fineweb_name=<glob> or data.source=files") from None
    yield from _rows_text(rows)


def documents(cfg: DataConfig) -> Iterator[str]:
    if cfg.source == "embedded":
        return embedded_documents()
    if cfg.source == "files":
        return file_documents(cfg)
    if cfg.source == "python_source":
        return python_source_documents()
    return fineweb_documents(cfg)
