"""The lock that holds on any shared disk (ddl.locks): flock where honoured; else (DDL_LOCKS=file, what a Lustre
mount without working flock gets) a lock file created with O_EXCL and kept fresh by a heartbeat, taken over once its
holder is dead."""

import multiprocessing
import os
import signal
import threading
import time

import pytest

from ddl import locks


def _hold(path, started, mode):
    os.environ[locks.LOCKS_ENV] = mode
    locks.HEARTBEAT_S = 0.2                                          # alive: fresher than the waiter's STALE_S
    with locks.exclusive(path):
        started.set()
        time.sleep(600)


@pytest.mark.parametrize("mode", ["flock", "file"])
def test_a_second_holder_waits_and_a_dead_holders_lock_is_taken_over(tmp_path, monkeypatch, mode):
    """Another process holds the lock: this one waits; the holder SIGKILLed, this one gets it (flock: at once, the
    kernel releases it; the lock file: once its heartbeat is STALE_S old)."""
    monkeypatch.setenv(locks.LOCKS_ENV, mode)
    monkeypatch.setattr(locks, "STALE_S", 2.0)
    path = tmp_path / "data" / "x.lock"
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    holder = context.Process(target=_hold, args=(path, started, mode))
    holder.start()
    assert started.wait(60)
    lock, got = locks.exclusive(path), []                           # held by this test until it ends
    waiter = threading.Thread(target=lambda: got.append(lock.__enter__()), daemon=True)
    waiter.start()
    waiter.join(3)
    assert not got                                                  # held: it waits
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(30)
    waiter.join(30)
    assert got == [None]                                            # then it holds it
    if mode == "file":
        assert (tmp_path / "data" / "x.lock.held").is_file() and not list((tmp_path / "data").glob("*.stale-*"))


def test_the_lock_file_is_refreshed_while_held_and_removed_after(tmp_path, monkeypatch):
    monkeypatch.setenv(locks.LOCKS_ENV, "file")
    monkeypatch.setattr(locks, "HEARTBEAT_S", 0.2)
    held = tmp_path / "x.lock.held"
    with locks.exclusive(tmp_path / "x.lock"):
        first = held.stat().st_mtime_ns
        time.sleep(1.0)
        assert held.stat().st_mtime_ns > first                      # its heartbeat: a waiter sees it alive
    assert not held.exists()


def test_an_unknown_lock_kind_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(locks.LOCKS_ENV, "nfs")
    with pytest.raises(ValueError, match=r"^DDL_LOCKS='nfs': must be flock \(where the filesystem honours it\) or "):
        locks.mode()
