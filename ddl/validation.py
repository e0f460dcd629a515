"""Config errors at the edge: one line, `<group>.<key>=<value>: <what is allowed>`, as a ValueError.

Pure Python (no torch, nothing else from ddl), so every config module, ddl.model's too, can use it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import Callable, NoReturn

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NAME_MAX = 64
NAME_RULE = (f"must be a non-empty name of at most {NAME_MAX} letters, digits, '.', '_' or '-', starting with a "
             f"letter or digit")


def shown(value, width: int = 60) -> str:
    """repr(value), cut to `width` characters: an error stays one readable line whatever it quotes."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}...({len(text)} characters)"


def unknown_names(option: str, names: list[str], allowed) -> str | None:
    """The one-line refusal of a comma-separated option's names that are not in `allowed`, or None."""
    unknown = [name for name in names if name not in allowed]
    return f"{option}: {', '.join(map(shown, unknown))} unknown; allowed: {', '.join(allowed)}" if unknown else None


def failure(group: str = "") -> Callable[[str, object, str], NoReturn]:
    """fail(key, value, allowed) for one config group: failure("train")("lr", 0, "...") raises
    ValueError("train.lr=0: ...")."""
    prefix = f"{group}." if group else ""

    def fail(key: str, value, allowed: str) -> NoReturn:
        raise ValueError(f"{prefix}{key}={shown(value)}: {allowed}")
    return fail


def is_int(value) -> bool:
    """An integer that is not a bool (YAML's true would pass isinstance(value, int))."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite(value) -> bool:
    """A number that is neither nan nor infinite."""
    return is_number(value) and math.isfinite(value)


def safe_name(key: str, value) -> str:
    """A name that becomes a directory (reports/<name>, sweeps/<name>) or a line of a job script: a
    safe character set and length, so it can neither leave its folder nor start a new line."""
    if is_int(value):
        value = str(value)
    if not isinstance(value, str) or len(value) > NAME_MAX or not NAME.fullmatch(value):
        raise ValueError(f"{key}={shown(value)}: {NAME_RULE}")
    return value


def env_seconds(name: str, default: float) -> float:
    """A number of seconds > 0 from the environment variable `name` (unset: `default`); else one line."""
    value = os.environ.get(name, "")
    try:
        seconds = float(value) if value else default
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{name}={value!r}: must be a number of seconds > 0 (default {default:g})")
    return seconds


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too) whose refusal is its one error line, exit 2, without the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def at_least_one(value: str) -> int:
    """An argparse type: a whole number >= 1 (a count of rounds, workers, features), else its one-line refusal."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{shown(value)}: must be an integer >= 1")
    return int(value)


def positive_number(value: str) -> float:
    """An argparse type: a finite number > 0 (megabytes, seconds), else its one-line refusal."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"{shown(value)}: must be a finite number > 0")
    return number


def printable_path(value: str) -> Path:
    """An argparse type: a path without control characters (a newline would start a line in what names it)."""
    if not value or not value.isprintable():
        raise argparse.ArgumentTypeError(f"{shown(value)}: must be a non-empty path of printable characters")
    return Path(value)
