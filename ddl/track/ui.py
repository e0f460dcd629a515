"""`ddl-ui` / `make ui`: the MLflow UI over the project's store, on 127.0.0.1 by default.

Experiments are tagged as model training (store.py), so the UI opens on the runs table, not
MLflow 3's GenAI overview; the printed links go straight to each experiment's runs.
"""

from __future__ import annotations

import argparse
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
         "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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
    process.terminate()
    raise RuntimeError(f"mlflow server did not answer on {base} within {timeout_s:.0f} s")


def runs_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}/runs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddl-ui", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    args = parser.parse_args(argv)
    from .store import client
    experiments = [e for e in client().search_experiments() if e.name != "Default"]
    process, base = start(args.host, args.port)
    print(f"MLflow UI for {paths.tracking_uri()}: {base}")
    for exp in experiments:
        print(f"  {exp.name:<16} {runs_url(base, exp.experiment_id)}")
    print("Ctrl-C to stop.", flush=True)
    try:
        process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait(10)
    return 0
