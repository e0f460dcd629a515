"""The browse path for real: `mlflow server` over a store written by a real sweep, its REST API,
a headless Chromium rendering the runs table, and `ddl-ui` itself: how it starts and stops."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import VENV_BIN, run_cli

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--virtual-time-budget=15000"]


@pytest.fixture(scope="module")
def server(module_ddl_home):
    sweep = run_cli("ddl-run", "-m", "residual=ddl,baseline", "model=micro", "train=smoke", "experiment=ui")
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    from ddl.track import ui
    server = ui.start(port=kernel_port())             # not 5000's range: other test sessions may use it
    yield server.base, module_ddl_home
    ui.stop(server)


def kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def experiment_id(base):
    with urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=ui") as response:
        return json.loads(response.read())["experiment"]["experiment_id"]


@pytest.mark.slow
def test_the_rest_api_serves_the_sweeps_runs_params_and_metrics(server):
    base, _ = server
    assert base.startswith("http://127.0.0.1:")
    runs = post(f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id(base)]})["runs"]
    assert sorted(r["info"]["run_name"] for r in runs) == ["baseline-micro-s0", "ddl_dv1-micro-s0"]
    for run in runs:
        assert run["info"]["status"] == "FINISHED"
        params = {p["key"]: p["value"] for p in run["data"]["params"]}
        metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
        assert params["model.size"] == "micro" and "val/loss" in metrics and "final/val/loss" in metrics


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="chromium is not installed (scripts/system-deps needs root + apt)")
def test_chromium_renders_the_run_names(server, tmp_path):
    from ddl.track import ui
    base, _ = server
    url = ui.runs_url(base, experiment_id(base))                     # the link ddl-ui prints
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]       # a fresh browser: GenAI would be its default
    dom = subprocess.run(["chromium", *CHROMIUM_FLAGS, *profile, "--dump-dom", url], capture_output=True,
                         text=True, timeout=120).stdout
    assert "baseline-micro-s0" in dom and "ddl_dv1-micro-s0" in dom
    assert ">Model registry<" in dom                                   # the model-training workspace's sidebar
    assert ">Judges<" not in dom and ">Playground<" not in dom         # not the GenAI one's
    shot = tmp_path / "runs.png"
    subprocess.run(["chromium", *CHROMIUM_FLAGS, *profile, "--window-size=1400,900", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000


def _descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every live process below `pid`."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        try:
            found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        todo += children.get(child, [])
    return found


def _serving(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_ddl_ui_says_it_starts_takes_the_port_after_a_busy_5000_runs_no_job_workers_and_stops_fast(ddl_home,
                                                                                                   tmp_path):
    from ddl.track import store, ui
    store.experiment_id("browse")
    held = socket.socket()
    with contextlib.suppress(OSError):                                # 5000 is busy (if not already)
        held.bind(("127.0.0.1", ui.DEFAULT_PORT))
        held.listen()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    started = time.monotonic()
    process = subprocess.Popen([str(VENV_BIN / "ddl-ui")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        first = process.stdout.readline()
        assert time.monotonic() - started < 5, "the first line came late"
        port = int(first.split("http://127.0.0.1:", 1)[1].split()[0])
        assert port > ui.DEFAULT_PORT and first.startswith("ddl-ui: starting MLflow's server on ")
        assert f"(port {ui.DEFAULT_PORT} is in use)" in first, first
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines[0].rstrip().endswith(f"http://127.0.0.1:{port}/#/experiments?workflowType=machine_learning")
        assert "/runs?workflowType=machine_learning" in lines[1] and "browse" in lines[1]
        server = _descendants(process.pid)
        assert any("uvicorn" in cmd for cmd in server.values()), server
        assert not [cmd for cmd in server.values() if "huey" in cmd or "_job_runner" in cmd], server
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        assert process.returncode == 0 and time.monotonic() - stopping < 10
        assert not _serving(port) and not any(Path(f"/proc/{pid}").exists() for pid in server)
    finally:
        held.close()
        if process.poll() is None:                                    # a failed check: ddl-ui stops its server
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    assert not list(cwd.iterdir())                                    # nothing (./mlruns) where it was started


def _gone(pid: int) -> bool:
    """Whether the process has exited (a zombie has: nothing reaps an orphan's here, PID 1 may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_a_sigkill_of_ddl_ui_takes_its_server_and_the_servers_workers_along(ddl_home):
    from ddl.track import ui
    port = kernel_port()
    process = subprocess.Popen([str(VENV_BIN / "ddl-ui"), "--port", str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in process.stdout:
            if "Ctrl-C to stop." in line:
                break
        server = _descendants(process.pid)
        assert _serving(port) and any("uvicorn" in cmd for cmd in server.values()), server
        process.kill()
        process.wait()
        deadline = time.monotonic() + 120                             # a bound, not a measurement
        while not (ui.port_is_free("127.0.0.1", port) and all(map(_gone, server))):
            assert time.monotonic() < deadline, {pid: cmd for pid, cmd in server.items() if not _gone(pid)}
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            process.kill()


def test_mlflows_default_experiment_lives_in_ddl_home(ddl_home, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    from ddl.track import store
    default = store.client().get_experiment_by_name("Default")
    assert default.artifact_location == (ddl_home / "mlartifacts" / "0").as_uri()
    assert not list(cwd.iterdir())
