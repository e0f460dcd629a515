"""A preparation's progress line: tokens written, tokens/s and the ETA of its budget.

The budget is the token budget where the source has one (FineWeb-Edu), else the source's bytes: the
ETA is then the time the bytes left take at this run's pace. On a terminal the line is redrawn in
place; elsewhere (a SLURM log, a launcher's pipe) it is printed every DDL_PROGRESS_S seconds (30).
"""

from __future__ import annotations

import sys
import time

from ..text import PROGRESS_DEFAULT_S, PROGRESS_ENV, duration
from ..validation import env_seconds


def _count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


class Meter:
    def __init__(self, name: str, workers: int, tokens: int = 0, budget: int | None = None,
                 total_bytes: int | None = None, enabled: bool = True):
        self.name, self.workers, self.budget, self.total_bytes = name, workers, budget, total_bytes
        self.start_tokens = self.tokens = tokens
        self.bytes_done = 0
        self.enabled, self.tty = enabled, sys.stderr.isatty()
        self.every_s = env_seconds(PROGRESS_ENV, PROGRESS_DEFAULT_S)
        self.started = self.last = time.monotonic()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        """Tokens a second written by this run (a resumed run's earlier tokens not counted)."""
        return (self.tokens - self.start_tokens) / max(self.seconds, 1e-9)

    def eta_s(self) -> float | None:
        if self.budget is not None and self.rate > 0:
            return max(self.budget - self.tokens, 0) / self.rate
        if self.total_bytes and self.bytes_done:
            return self.seconds * max(self.total_bytes - self.bytes_done, 0) / self.bytes_done
        return None

    def line(self) -> str:
        of = f" of {_count(self.budget)}" if self.budget is not None else ""
        eta = self.eta_s()
        return (f"tokenizing {self.name}: {_count(self.tokens)}{of} tokens, {_count(self.rate)} tok/s on "
                f"{self.workers} worker{'s' * (self.workers != 1)}" + (f", ETA {duration(eta)}" if eta is not None
                                                                        else ""))

    def update(self, tokens: int, unit_bytes: int) -> None:
        self.tokens, self.bytes_done = tokens, self.bytes_done + unit_bytes
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            print(f"\r{self.line()}\033[K", end="", file=sys.stderr, flush=True)
        elif now - self.last >= self.every_s:
            self.last = now
            print(f"{time.strftime('%H:%M:%S')} {self.line()}", file=sys.stderr, flush=True)

    def abort(self) -> None:
        """A failed build: a terminal's line ended, so the error is a line of its own."""
        if self.enabled and self.tty:
            print(file=sys.stderr, flush=True)

    def close(self) -> str:
        """The last line: what this run wrote and its pace (and a terminal's line ended)."""
        done = (f"tokenized {self.name}: {self.tokens - self.start_tokens:,} tokens in {self.seconds:.1f} s, "
                f"{self.rate:,.0f} tok/s on {self.workers} worker{'s' * (self.workers != 1)}")
        if self.enabled:
            print(("\r" if self.tty else "") + done + ("\033[K" if self.tty else ""), file=sys.stderr, flush=True)
        return done
