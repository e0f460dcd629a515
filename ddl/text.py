"""Words for the console: a count with its noun in the right number ("1 job", "3 jobs")."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 job', '2 jobs', '0 jobs'; `nouns` where adding an s is wrong ('1 override set' is regular)."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
