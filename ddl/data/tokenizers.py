"""Tokenizers: byte (offline default), bpe (trained on the train split), gpt2 (the paper's, tiktoken).

`encode_docs` is what preparation calls: a batch of documents in one call to the library (its own threads
off: a prepare's parallelism is its worker processes), as uint16 tokens with the eot after each document.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable, Protocol

import numpy as np

from .. import paths


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot: int  # document separator written between documents

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def encode_docs(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]: ...


def _with_eot(id_lists: list[list[int]], eot: int) -> tuple[np.ndarray, np.ndarray]:
    """(every document's ids followed by the eot, as uint16; each document's token count, its eot included)."""
    counts = np.fromiter(map(len, id_lists), np.int64, len(id_lists))
    flat = np.fromiter(itertools.chain.from_iterable(id_lists), np.uint16, int(counts.sum()))
    return np.insert(flat, np.cumsum(counts), eot), counts + 1


class ByteTokenizer:
    """UTF-8 bytes; byte 0 (NUL, absent from text) separates documents."""
    name, vocab_size, eot = "byte", 256, 0

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def encode_docs(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encoded = [text.encode("utf-8") for text in texts]
        if not encoded:
            return np.zeros(0, np.uint16), np.zeros(0, np.int64)
        joined = np.frombuffer(bytes([self.eot]).join(encoded) + bytes([self.eot]), np.uint8)
        return joined.astype(np.uint16), np.fromiter((len(b) + 1 for b in encoded), np.int64, len(encoded))


class BPETokenizer:
    """Byte-level BPE from the `tokenizers` library, trained on the training split only."""
    name, eot = "bpe", 0
    FILE = "tokenizer.json"

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer
        self._tok = HFTokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, path: Path) -> "BPETokenizer":
        from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(texts, trainer=trainer)
        paths.write_atomic(path, tok.to_str(pretty=True))
        return cls(path)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_docs(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _with_eot([e.ids for e in self._tok.encode_batch_fast(texts)], self.eot)   # no offsets: faster

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


class GPT2Tokenizer:
    """GPT-2 BPE through tiktoken. It needs its BPE file: network or TIKTOKEN_CACHE_DIR."""
    name, vocab_size, eot = "gpt2", 50257, 50256

    def __init__(self, encoding=None):
        """tiktoken's GPT-2 encoding (`encoding`: another tiktoken Encoding, as the data bench's stand-in)."""
        import tiktoken
        try:
            self._enc = encoding or tiktoken.get_encoding("gpt2")
        except Exception as err:  # tiktoken raises requests/OS errors when it cannot download
            raise ValueError(
                "data.tokenizer='gpt2': tiktoken's GPT-2 BPE file is not cached and cannot be downloaded "
                f"({type(err).__name__}); run once with network or point TIKTOKEN_CACHE_DIR at a cache "
                "that has it, or use data.tokenizer=byte|bpe") from None

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_docs(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _with_eot(self._enc.encode_ordinary_batch(texts, num_threads=1), self.eot)

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)


def load_tokenizer(name: str, dataset_dir: Path | None = None) -> Tokenizer:
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    if name == "bpe":
        if dataset_dir is None or not (dataset_dir / BPETokenizer.FILE).is_file():
            raise ValueError(f"data.tokenizer='bpe': no {BPETokenizer.FILE} in {dataset_dir}")
        return BPETokenizer(dataset_dir / BPETokenizer.FILE)
    raise ValueError(f"data.tokenizer={name!r}: must be one of byte, bpe, gpt2")
