"""Two sweeps on one home: a signature is trained by one process at a time, and the store is created once."""

import multiprocessing

import pytest

from tests.conftest import logged_steps, mlflow_runs
from tests.test_faults import start

SMOKE = ["model=micro", "train=smoke"]


def _create_store(home, ready):
    import os
    os.environ["DDL_HOME"] = str(home)
    ready.wait()
    from ddl.track import store
    store.experiment_id("together")


@pytest.mark.slow
def test_processes_creating_the_store_at_once_all_get_it(tmp_path, monkeypatch):
    """MLflow migrates a new SQLite store's schema in the first process that opens it; a second one doing
    the same at once crashed inside the migration."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    procs = [ctx.Process(target=_create_store, args=(tmp_path / "home", ready)) for _ in range(3)]
    for p in procs:
        p.start()
    ready.set()
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    monkeypatch.setenv("DDL_HOME", str(tmp_path / "home"))
    from ddl.track import store
    assert store.client().get_experiment_by_name("together") is not None


@pytest.mark.slow
def test_two_identical_sweeps_at_once_train_each_job_once(ddl_home):
    args = ["ddl-run", "-m", "residual=ddl,baseline", *SMOKE, "experiment=twice"]
    sweeps = [start(*args) for _ in range(2)]
    outputs = [sweep.communicate(timeout=900) for sweep in sweeps]
    assert [s.returncode for s in sweeps] == [0, 0], [err[-2000:] for _, err in outputs]
    runs = mlflow_runs("twice")
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    assert [logged_steps(r) for r in runs] == [([5, 10, 15, 20], [10, 20])] * 2           # each step logged once
    text = "".join(out for out, _ in outputs)
    assert "running elsewhere" in text or text.count("skipped") >= 2
