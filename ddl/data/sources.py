"""Text sources: each yields documents (str) in a fixed order; a document's split is a hash of it.

The embedded default is the documentation text shipped inside CPython (`pydoc_data.topics`,
~0.47 MB of English prose and code examples from the Python reference manual: the text behind
`help('topic')`). It needs no network and no download. Topics are cut at blank lines into
documents of about 1000 characters or more (a topic's last piece may be shorter), so the
held-out split is spread over the whole manual.
"""

from __future__ import annotations

import glob
import hashlib
import json
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


def _rows_text(rows) -> Iterator[str]:
    for row in rows:
        text = row.get("text")
        if text:
            yield text


def _json_lines(path: str) -> Iterator[dict]:
    """JSON Lines (also under a .json name): one object with a `text` field per line."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict):
                raise ValueError(f"data.files: {path}:{number}: must be JSON Lines, one object with a 'text' field "
                                 f"per line")
            yield row


def file_documents(pattern: str) -> Iterator[str]:
    """.txt: one document per file; .jsonl/.parquet: one per row's `text` field (via datasets)."""
    paths = sorted(p for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    if not paths:
        raise ValueError(f"data.files={pattern!r}: matches no file")
    for path in paths:
        suffix = Path(path).suffix
        if suffix == ".txt":
            yield Path(path).read_text(encoding="utf-8")
        elif suffix in (".jsonl", ".json"):
            yield from _rows_text(_json_lines(path))
        elif suffix == ".parquet":
            yield from _rows_text(_stream("parquet", data_files=path))
        else:
            raise ValueError(f"data.files={pattern!r}: {path} is not .txt, .jsonl or .parquet")


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
        return file_documents(cfg.files)
    return fineweb_documents(cfg)
