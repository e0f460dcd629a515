"""Signals turned into a flag read at a safe point (no torch here: the sweep's launcher uses it too)."""

from __future__ import annotations

import contextlib
import signal


class DeferredSignals:
    """Within `with`, each of `signals` only sets `received` (a signal the process was started ignoring
    stays ignored); the previous handlers come back on exit."""

    def __init__(self, signals: tuple[int, ...]):
        self.signals = signals
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self):
        with contextlib.suppress(ValueError):  # only the main thread may install handlers
            for sig in self.signals:
                if signal.getsignal(sig) != signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
