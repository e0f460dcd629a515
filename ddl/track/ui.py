"""`ddl-ui` / `make ui`: the MLflow UI over the project's store, on 127.0.0.1 by default.

It says it is starting at once, serves on MLflow's usual port 5000 (or the next free one, named),
and runs MLflow's server without its job-execution workers (a browse-only UI never uses them; they
made it take most of a minute to start). The printed links open MLflow 3's model-training
workspace (Runs, Models, Model registry in the sidebar): its UI picks the workspace from the URL's
`workflowType`, else from what the browser last chose, and a fresh browser gets the GenAI one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from .. import paths

DEFAULT_PORT = 5000            # MLflow's own: a bookmark keeps working from one start to the next
PORTS_TRIED = 100
WORKSPACE = "workflowType=machine_learning"
# The server's environment: no huey job-execution workers (7 processes of ~250 MB, a minute to start).
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


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


def start(host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 90) -> tuple[subprocess.Popen, str]:
    """Start `mlflow server` on the store; return (process, base URL) once it answers /health."""
    port = port or pick_port(host)
    paths.home().mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", paths.tracking_uri(),
         "--default-artifact-root", paths.artifacts_dir().as_uri(), "--host", host, "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **SERVER_ENV},
        start_new_session=True)   # its own process group: stop() ends the server and its workers together
    base = f"http://{host}:{port}"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {process.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                if response.status == 200:
                    return process, base
        except OSError:
            time.sleep(0.5)
    stop(process)
    raise RuntimeError(f"mlflow server did not answer on {base} within {timeout_s:.0f} s")


def stop(process: subprocess.Popen, timeout_s: float = 10) -> None:
    """SIGTERM to the server's process group (the server and its workers), SIGKILL if it lingers."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"--port={text}: must be an integer in [1, 65535]")
    return int(text)


def _stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def ui_url(base: str) -> str:
    """The experiments list, in the model-training workspace."""
    return f"{base}/#/experiments?{WORKSPACE}"


def runs_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs?{WORKSPACE}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddl-ui", description=__doc__,
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
        process, base = start(args.host, port)
    except (ValueError, RuntimeError, OSError) as err:
        print(f"ddl-ui: error: {str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}")
        return 2
    signal.signal(signal.SIGTERM, _stop_on_sigterm)    # `kill <pid>` stops the server too, as Ctrl-C does
    try:
        print(f"MLflow UI for {paths.tracking_uri()}: {ui_url(base)}")
        for exp in experiments:
            print(f"  {exp.name:<16} {runs_url(base, exp.experiment_id)}")
        print("Ctrl-C to stop.", flush=True)
        process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):   # a second signal must not leave the server behind
            signal.signal(sig, signal.SIG_IGN)
        stop(process)
    return 0
