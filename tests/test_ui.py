"""The browse path for real: `mlflow server` over a store written by a real sweep, its REST API,
and a headless Chromium rendering the runs table."""

import json
import shutil
import subprocess
import urllib.request

import pytest

from tests.conftest import run_cli

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--virtual-time-budget=15000"]


@pytest.fixture(scope="module")
def server(module_ddl_home):
    sweep = run_cli("ddl-run", "-m", "residual=ddl,baseline", "model=micro", "train=smoke", "experiment=ui")
    assert sweep.returncode == 0, sweep.stderr[-2000:]
    from ddl.track import ui
    process, base = ui.start()
    yield base, module_ddl_home
    process.terminate()
    process.wait(10)


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
    base, _ = server
    url = f"{base}/#/experiments/{experiment_id(base)}/runs"
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(["chromium", *CHROMIUM_FLAGS, *profile, "--dump-dom", url], capture_output=True,
                         text=True, timeout=120).stdout
    assert "baseline-micro-s0" in dom and "ddl_dv1-micro-s0" in dom
    shot = tmp_path / "runs.png"
    subprocess.run(["chromium", *CHROMIUM_FLAGS, *profile, "--window-size=1400,900", f"--screenshot={shot}", url],
                   capture_output=True, timeout=120)
    assert shot.stat().st_size > 10_000
