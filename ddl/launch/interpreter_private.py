"""Every private name of the Python runtime (threading, atexit) the project uses, and nothing else: an upgrade that
moves one breaks this module alone, and tests/test_private_apis.py says which name and which Python version."""

from __future__ import annotations

import atexit
import threading

CHECKED_WITH = "3.11"


def finish_as_at_exit() -> None:
    """What the interpreter does as it exits: join the threads that are not daemons, then run the atexit handlers
    (a forked job ends with os._exit, which does neither)."""
    threading._shutdown()
    atexit._run_exitfuncs()
