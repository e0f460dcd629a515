"""DataConfig: which text becomes which tokens. Light to import (no torch): dry runs use it."""

from __future__ import annotations

import codecs
import hashlib
import importlib.metadata
import io
import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

from ..validation import failure, is_int, is_number

SOURCES = ("embedded", "python_source", "files", "fineweb_edu")
TOKENIZERS = ("byte", "bpe", "gpt2")
ENCODING_ERRORS = ("strict", "replace", "ignore")   # what a byte the encoding cannot decode does (Python's names)
GPT2_VOCAB = 50257
# The commit of HuggingFaceFW/fineweb-edu a Hub source streams (data.fineweb_revision): a dataset built from the Hub
# names it, so a resume after an upstream update never mixes two revisions.
FINEWEB_REVISION = "87f09149ef4734204d70ed1d046ddc9ca3f2b8f9"
VAL_FRACTION = 0.1   # the share of documents held out by default (the offline eval task reads the embedded one's)


_fail = failure("data")


def python_source_versions() -> dict[str, str]:
    """What the python_source text (ddl.data.sources) is a function of: part of its dataset's name."""
    return {"python": platform.python_version(), "torch": importlib.metadata.version("torch")}


def is_local(name: str) -> bool:
    """A local parquet glob or folder, not a Hub id (`org/name`)."""
    return name.endswith(".parquet") or name.startswith(("/", ".", "~")) or Path(name).exists()


@dataclass(frozen=True)
class DataConfig:
    source: str = "embedded"
    tokenizer: str = "byte"
    files: str | None = None                          # glob of .txt/.jsonl/.parquet (source=files)
    encoding: str = "utf-8"                           # of those .txt/.jsonl files
    encoding_errors: str = "strict"                   # strict (refuse the file) | replace (with U+FFFD) | ignore
    fineweb_name: str = "HuggingFaceFW/fineweb-edu"   # a Hub id, or a local parquet glob
    fineweb_config: str = "sample-10BT"
    fineweb_tokens: int = 100_000_000
    fineweb_revision: str = FINEWEB_REVISION          # the Hub commit streamed (a local glob ignores it)
    val_fraction: float = VAL_FRACTION
    bpe_vocab: int = 4096

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            _fail("source", self.source, f"must be one of {', '.join(SOURCES)}")
        if self.tokenizer not in TOKENIZERS:
            _fail("tokenizer", self.tokenizer, f"must be one of {', '.join(TOKENIZERS)}")
        if self.source == "files" and not self.files:
            _fail("files", self.files, "source=files needs a glob of .txt/.jsonl/.parquet files")
        for key in ("files", "fineweb_name", "fineweb_config", "fineweb_revision"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                _fail(key, getattr(self, key), "must be a string")
        try:                                          # what open() takes: a text encoding Python knows
            io.TextIOWrapper(io.BytesIO(), encoding=self.encoding)
        except (LookupError, TypeError):
            _fail("encoding", self.encoding, "must be a text encoding Python knows (utf-8, latin-1, cp1252, ...)")
        if self.encoding_errors not in ENCODING_ERRORS:
            _fail("encoding_errors", self.encoding_errors, f"must be one of {', '.join(ENCODING_ERRORS)}")
        if not is_number(self.val_fraction) or not 0.0 < self.val_fraction < 0.5:
            _fail("val_fraction", self.val_fraction, "must be a number in (0, 0.5)")
        if not is_int(self.fineweb_tokens) or self.fineweb_tokens < 1:
            _fail("fineweb_tokens", self.fineweb_tokens, "must be an integer >= 1")
        if not is_int(self.bpe_vocab) or not 260 <= self.bpe_vocab <= 65535:
            _fail("bpe_vocab", self.bpe_vocab, "must be an integer in [260, 65535] (uint16 shards)")

    def source_params(self) -> dict:
        """The fields that decide the tokens (what a dataset directory is named by)."""
        params = {"source": self.source, "tokenizer": self.tokenizer, "val_fraction": self.val_fraction}
        if self.source == "files":   # its encoding only where it is not the default: earlier names stay
            params["files"] = self.files
            decoding = {"encoding": codecs.lookup(self.encoding).name, "encoding_errors": self.encoding_errors}
            params.update({key: value for key, value in decoding.items() if value != getattr(DataConfig, key)})
        if self.source == "fineweb_edu":
            params.update(name=self.fineweb_name, config=self.fineweb_config, tokens=self.fineweb_tokens)
            if not is_local(self.fineweb_name):
                params["revision"] = self.fineweb_revision
        if self.source == "python_source":
            params.update(python_source_versions())
        if self.tokenizer == "bpe":
            params["bpe_vocab"] = self.bpe_vocab
        return params

    def dataset_name(self) -> str:
        digest = hashlib.sha256(json.dumps(self.source_params(), sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.source}-{self.tokenizer}-{digest}"

    def model_vocab_size(self) -> int:
        """The model's vocabulary for this tokenizer, padded to a multiple of 64 (GPT-2 -> 50304)."""
        raw = {"byte": 256, "gpt2": GPT2_VOCAB, "bpe": self.bpe_vocab}[self.tokenizer]
        return -(-raw // 64) * 64

    def to_dict(self) -> dict:
        return asdict(self)
