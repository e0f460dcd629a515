import os
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def ddl_home(tmp_path, monkeypatch):
    home = tmp_path / "ddl_home"
    monkeypatch.setenv("DDL_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture(scope="module")
def module_ddl_home(tmp_path_factory):
    """One DDL_HOME for a whole module, for fixtures that run a sweep once and share it."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("ddl_home")
        mp.setenv("DDL_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield home


def run_cli(tool: str, *args: str, cwd=None, timeout=600, env_extra=None) -> subprocess.CompletedProcess:
    """Run an installed console script (ddl-run, ddl-report, ...) the way a user does."""
    return subprocess.run([str(VENV_BIN / tool), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})})


def mlflow_runs(experiment: str):
    from ddl.track import store
    c = store.client()
    exp = c.get_experiment_by_name(experiment)
    return [] if exp is None else c.search_runs([exp.experiment_id])


def logged_steps(run, keys=("train/loss", "val/loss")) -> tuple[list[int], ...]:
    """The steps of the run's points for each key, sorted: a step logged twice shows twice."""
    from ddl.track import store
    c = store.client()
    return tuple(sorted(m.step for m in c.get_metric_history(run.info.run_id, key)) for key in keys)
