"""`ddl-ui` / `make ui`: the MLflow UI over the project's store, on 127.0.0.1 by default.

Experiments are tagged as model training (store.py), so the UI opens on the runs table, not
MLflow 3's GenAI overview; the printed links go straight to each experiment's runs.
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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start(host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 90) -> tuple[subprocess.Popen, str]:
    """Start `mlflow server` on the store; return (process, base URL) once it answers /health."""
    port = port or free_port(host)
    paths.home().mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", paths.tracking_uri(),
         "--default-artifact-root", paths.artifacts_dir().as_uri(), "--host", host, "--port", str(port),
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
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


def runs_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddl-ui", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=_port, default=None, help="default: a free port")
    args = parser.parse_args(argv)
    from .store import client
    try:
        experiments = [e for e in client().search_experiments() if e.name != "Default"]
        process, base = start(args.host, args.port)
    except (ValueError, RuntimeError, OSError) as err:
        print(f"ddl-ui: error: {str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}")
        return 2
    signal.signal(signal.SIGTERM, _stop_on_sigterm)    # `kill <pid>` stops the server too, as Ctrl-C does
    try:
        print(f"MLflow UI for {paths.tracking_uri()}: {base}")
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
