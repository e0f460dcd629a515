"""Words for the console: a count with its noun in the right number ("1 job", "3 jobs"), a duration, and how
often a progress line is printed where output is not a terminal."""

from __future__ import annotations

import time

PROGRESS_ENV, PROGRESS_DEFAULT_S = "DDL_PROGRESS_S", 30.0


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 job', '2 jobs', '0 jobs'; `nouns` where adding an s is wrong ('1 override set' is regular)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def duration(seconds: float | None) -> str:
    """'00:02:10', '1d 03:00:00'; '' for None."""
    if seconds is None:
        return ""
    days = int(seconds // 86400)
    return (f"{days}d " if days else "") + time.strftime("%H:%M:%S", time.gmtime(seconds % 86400))
