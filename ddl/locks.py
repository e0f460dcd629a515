"""A lock that holds on any shared disk, for what several machines may build or submit at once (a dataset).

`exclusive(path)` takes an flock on `path` where the filesystem honours it (local disks, NFSv4, Lustre mounted
with `-o flock`): the kernel releases it when its holder dies. Where flock is refused (Lustre without `-o flock`
answers ENOSYS), or where DDL_LOCKS=file says it is honoured on one node only (Lustre's `-o localflock`), the lock is
the file `<path>.held`, created with O_EXCL (atomic on those filesystems) and kept fresh by a heartbeat thread: a
waiter takes over a held file whose heartbeat stopped (its holder was killed) for STALE_S.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path

LOCKS_ENV = "DDL_LOCKS"              # flock (default: flock where honoured) | file (the O_EXCL lock file always)
HEARTBEAT_S = 5.0                    # the held file's mtime is refreshed this often
STALE_S = 60.0                       # a held file not refreshed for this long is its dead holder's
POLL_S = 0.5
NOT_HONOURED = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


def mode() -> str:
    """The lock kind DDL_LOCKS asks for; one line (ValueError) for another value."""
    found = os.environ.get(LOCKS_ENV, "flock")
    if found not in ("flock", "file"):
        raise ValueError(f"{LOCKS_ENV}={found!r}: must be flock (where the filesystem honours it) or file (a lock "
                         f"file with a heartbeat, for a filesystem whose flock holds on one node only)")
    return found


@contextlib.contextmanager
def exclusive(path: Path):
    """Hold the lock of `path` (created with its folder) while the `with` runs; waits for another holder."""
    if mode() == "flock":
        while True:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                handle = open(path, "a")
            except FileNotFoundError:     # the folder, empty, was removed between the two
                continue
            with handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX)
                except OSError as err:
                    if err.errno not in NOT_HONOURED:
                        raise
                    break
                try:
                    if _still_named(handle, path):     # a holder may remove the file (and its folder) as it ends
                        yield
                        return
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _held_file(Path(f"{path}.held")):
        yield


def _still_named(handle, path: Path) -> bool:
    """Whether `path` is still the open file (not a new one beside a removed one, nor none)."""
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _held_file(held: Path):
    """The O_EXCL lock file, its heartbeat running while it is held; removed when released."""
    while not _create(held):
        _take_over_if_stale(held)
        time.sleep(POLL_S)
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(held, stop), daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        held.unlink(missing_ok=True)


def _create(held: Path) -> bool:
    try:
        fd = os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as file:
        json.dump({"host": socket.gethostname(), "pid": os.getpid()}, file)
    return True


def _heartbeat(held: Path, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        with contextlib.suppress(OSError):
            os.utime(held)


def _take_over_if_stale(held: Path) -> None:
    """Remove a held file whose heartbeat stopped STALE_S ago. It is renamed aside first (one waiter wins the
    rename); if what was renamed is not the stale file seen (a new holder's, created meanwhile), it goes back."""
    try:
        seen = held.stat()
    except FileNotFoundError:
        return
    if time.time() - seen.st_mtime < STALE_S:
        return
    aside = held.with_name(f"{held.name}.stale-{socket.gethostname()}-{os.getpid()}")
    try:
        os.rename(held, aside)
    except FileNotFoundError:
        return
    if os.stat(aside).st_ino != seen.st_ino:          # a fresh holder's file: put it back where it was
        with contextlib.suppress(FileExistsError):
            os.link(aside, held)
    aside.unlink(missing_ok=True)
