"""`ddl-ui` / `make ui`: the MLflow UI over the project's store, on 127.0.0.1 by default.

It says it is starting at once, serves on MLflow's usual port 5000 (or the next free one, named),
and runs MLflow's server without its job-execution workers (a browse-only UI never uses them; they
made it take most of a minute to start). The server dies with ddl-ui, however ddl-ui ends: Ctrl-C and
SIGTERM stop it; on a SIGKILL the kernel sends `mlflow server` SIGTERM (PR_SET_PDEATHSIG, Linux) and
a watchdog ends its whole process group (the uvicorn it runs included). The printed links open MLflow
3's model-training workspace (Runs, Models, Model registry in the sidebar): its UI picks the workspace
from the URL's `workflowType`, else from what the browser last chose, and a fresh browser gets the
GenAI one.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import NamedTuple

from .. import paths
from ..validation import OneLineParser, shown

DEFAULT_PORT = 5000            # MLflow's own: a bookmark keeps working from one start to the next
PORTS_TRIED = 100
WORKSPACE = "workflowType=machine_learning"
# The server's environment: no huey job-execution workers (7 processes of ~250 MB, a minute to start).
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
PR_SET_PDEATHSIG = 1           # linux/prctl.h
STOPPED = b"stopped"           # ddl-ui to its watchdog: the server is stopped, signal nothing


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (as uvicorn binds: SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def pick_port(host: str = "127.0.0.1", first: int = DEFAULT_PORT) -> int:
    """The first free port from `first` on (PORTS_TRIED of them)."""
    last = min(first + PORTS_TRIED, 65536) - 1
    port = next((p for p in range(first, last + 1) if port_is_free(host, p)), None)
    if port is None:
        raise RuntimeError(f"no free port in {first}-{last} on {host}; choose one with --port")
    return port


class Server(NamedTuple):
    process: subprocess.Popen      # `mlflow server`, the leader of its own process group
    watchdog: subprocess.Popen     # ends that group if this process dies first
    base: str                      # http://host:port


def start(host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 90) -> Server:
    """Start `mlflow server` on the store, and its watchdog; return them once the server answers /health."""
    port = port or pick_port(host)
    paths.home().mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", paths.tracking_uri(),
         "--default-artifact-root", paths.artifacts_dir().as_uri(), "--host", host, "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **SERVER_ENV}, preexec_fn=_die_with_parent if _prctl else None,
        start_new_session=True)   # its own process group: stop() ends the server and its workers together
    server = Server(process, _start_watchdog(process.pid), f"http://{host}:{port}")
    try:
        _wait_until_it_answers(server, timeout_s)
    except BaseException:          # Ctrl-C while it starts included
        stop(server)
        raise
    return server


def _wait_until_it_answers(server: Server, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {server.process.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{server.base}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"mlflow server did not answer on {server.base} within {timeout_s:.0f} s")


def stop(server: Server, timeout_s: float = 10) -> None:
    """SIGTERM to the server's process group (the server and its workers), SIGKILL if it lingers; then the
    watchdog is told the group is stopped (so it never signals a group id that may be reused) and exits."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, sig)
        try:
            server.process.wait(timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(BrokenPipeError):
        server.watchdog.stdin.write(STOPPED)
        server.watchdog.stdin.close()
    server.watchdog.wait()


_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)   # Linux's; resolved before any fork


def _die_with_parent() -> None:
    """In the server's process, between fork and exec: SIGTERM to it when the process that started it dies."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _start_watchdog(group: int) -> subprocess.Popen:
    """A process that ends process group `group` if this process dies first, a SIGKILL included: it reads a
    pipe that only this process writes to, whose end the kernel closes however this process ends. In a
    session of its own, so that a terminal's Ctrl-C does not end it first."""
    code = "import sys; from ddl.track.ui import watch; watch(int(sys.argv[1]))"
    return subprocess.Popen([sys.executable, "-c", code, str(group)], stdin=subprocess.PIPE, start_new_session=True)


def watch(group: int, timeout_s: float = 10) -> None:
    """The watchdog: at EOF without STOPPED, SIGTERM to the group, SIGKILL to what is left after timeout_s."""
    if sys.stdin.buffer.read(len(STOPPED)) == STOPPED:
        return
    with contextlib.suppress(ProcessLookupError):        # raised once the group is empty
        os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            os.killpg(group, 0)
        os.killpg(group, signal.SIGKILL)


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"--port={shown(text)}: must be an integer in [1, 65535]")
    return int(text)


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def ui_url(base: str) -> str:
    """The experiments list, in the model-training workspace."""
    return f"{base}/#/experiments?{WORKSPACE}"


def runs_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs?{WORKSPACE}"


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="ddl-ui", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=_port, default=None,
                        help=f"default: {DEFAULT_PORT}, MLflow's usual one, or the next free port")
    args = parser.parse_args(argv)
    try:
        port = args.port or pick_port(args.host)
        busy = "" if args.port or port == DEFAULT_PORT else f" (port {DEFAULT_PORT} is in use)"
        print(f"ddl-ui: starting MLflow's server on http://{args.host}:{port}{busy} ...", flush=True)
        from .store import client
        experiments = [e for e in client().search_experiments() if e.name != "Default"]
        server = start(args.host, port)
    except (ValueError, RuntimeError, OSError) as err:
        print(f"ddl-ui: error: {str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}")
        return 2
    signal.signal(signal.SIGTERM, _stop_on_sigterm)    # `kill <pid>` stops the server too, as Ctrl-C does
    try:
        print(f"MLflow UI for {paths.tracking_uri()}: {ui_url(server.base)}")
        for exp in experiments:
            print(f"  {exp.name:<16} {runs_url(server.base, exp.experiment_id)}")
        print("Ctrl-C to stop.", flush=True)
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):   # a second signal must not leave the server behind
            signal.signal(sig, signal.SIG_IGN)
        stop(server)
    return 0
