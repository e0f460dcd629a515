"""Config errors at the edge: one line, `<group>.<key>=<value>: <what is allowed>`, as a ValueError.

Pure Python (no torch, nothing else from ddl), so every config module, ddl.model's too, can use it.
"""

from __future__ import annotations

from typing import Callable, NoReturn


def failure(group: str = "") -> Callable[[str, object, str], NoReturn]:
    """fail(key, value, allowed) for one config group: failure("train")("lr", 0, "...") raises
    ValueError("train.lr=0: ...")."""
    prefix = f"{group}." if group else ""

    def fail(key: str, value, allowed: str) -> NoReturn:
        raise ValueError(f"{prefix}{key}={value!r}: {allowed}")
    return fail


def is_int(value) -> bool:
    """An integer that is not a bool (YAML's true would pass isinstance(value, int))."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """An int or a float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
