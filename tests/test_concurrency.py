"""Two sweeps on one home: a signature is trained by one process at a time, and the store is created once."""

import os
import subprocess
import time

import pytest

from tests.conftest import logged_steps, mlflow_runs, python_script
from tests.test_faults import start

SMOKE = ["model=micro", "train=smoke"]
# A process that opens the home's store (creating it) once the file `go` exists, after saying it is ready.
CREATE_STORE = """import os, sys, time
from ddl.track import store
ready, go = sys.argv[1:]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
store.experiment_id("together")
"""


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["empty", "unusable"])
def test_processes_creating_the_store_at_once_all_get_it(tmp_path, monkeypatch, cache):
    """A new SQLite store is created in the first process that opens it, from the user's schema template (which
    it makes, the cache being empty) or, where the cache cannot hold one, by MLflow's migrations in place; a
    second process migrating the same store at once crashed inside the migration. The three processes are
    forked from the warm server, MLflow imported, as a sweep's jobs are, and wait for one another."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if cache == "unusable":
        (tmp_path / "cache").write_text("a file, not a directory")
    script, go = tmp_path / "create_store.py", tmp_path / "go"
    script.write_text(CREATE_STORE)
    env = {**os.environ, "DDL_HOME": str(tmp_path / "home")}
    procs = [subprocess.Popen([*python_script(script), str(tmp_path / f"ready{i}"), str(go)], env=env)
             for i in range(3)]
    deadline = time.monotonic() + 300
    while not all((tmp_path / f"ready{i}").exists() for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    assert [p.wait(600) for p in procs] == [0, 0, 0]
    monkeypatch.setenv("DDL_HOME", str(tmp_path / "home"))
    from ddl.track import store
    assert store.client().get_experiment_by_name("together") is not None


def test_a_new_home_starts_from_the_schema_template_with_its_own_default_experiment(tmp_path, monkeypatch):
    """The first store this user creates makes a template of MLflow's schema in the user's cache, named by
    MLflow's version; the next home's store is a copy of it (it carries a mark put on the template, which a
    store migrated again would not), its Default experiment's artifacts in its own home, a store like any other."""
    import sqlite3
    from importlib.metadata import version

    from ddl.track import store
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    template = tmp_path / "cache" / "ddl" / f"mlflow-{version('mlflow')}-schema.db"
    for name in ("first", "second"):
        home = tmp_path / name
        monkeypatch.setenv("DDL_HOME", str(home))
        c = store.client()
        assert template.is_file(), name
        assert [(e.name, e.artifact_location) for e in c.search_experiments()] == [
            ("Default", (home / "mlartifacts" / "0").as_uri())]
        run = c.create_run(store.experiment_id(name))
        c.log_metric(run.info.run_id, "x", 1.0)
        assert c.get_run(run.info.run_id).data.metrics == {"x": 1.0}
        if name == "first":
            with sqlite3.connect(template) as db:
                db.execute("PRAGMA user_version = 41")                  # the mark: SQLite's own header field
    with sqlite3.connect(tmp_path / "second" / "mlflow.db") as db:
        assert db.execute("PRAGMA user_version").fetchone() == (41,)   # a copy, not migrated again
    assert not list(template.parent.glob(".*.tmp")) and not list(tmp_path.glob("*/.mlflow.db.*"))


@pytest.mark.parametrize("damage", ["garbled", "an older schema"])
def test_a_damaged_schema_template_is_dropped_and_the_store_migrated_in_place(tmp_path, monkeypatch, damage):
    """A template that MLflow's store does not accept (garbled bytes, or a schema behind MLflow's head) costs
    the home that meets it a migration in place, not its store; the next home makes the template again."""
    import sqlite3
    from importlib.metadata import version

    from ddl.track import store
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    template = tmp_path / "cache" / "ddl" / f"mlflow-{version('mlflow')}-schema.db"
    template.parent.mkdir(parents=True)
    if damage == "garbled":
        template.write_bytes(b"not a database " * 100)
    else:
        with sqlite3.connect(template) as db:
            db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
            db.execute("INSERT INTO alembic_version VALUES ('451aebb31d03')")    # MLflow 1.x's first revision
    for name in ("first", "second"):
        home = tmp_path / name
        monkeypatch.setenv("DDL_HOME", str(home))
        c = store.client()
        assert [(e.name, e.artifact_location) for e in c.search_experiments()] == [
            ("Default", (home / "mlartifacts" / "0").as_uri())], name
        c.log_metric(c.create_run(store.experiment_id(name)).info.run_id, "x", 1.0)
    with sqlite3.connect(template) as db:
        assert db.execute("SELECT count(*) FROM experiments").fetchone() == (0,)     # remade by "second"


@pytest.mark.slow
def test_two_identical_sweeps_at_once_train_each_job_once(ddl_home):
    args = ["ddl-run", "-m", "residual=ddl,baseline", *SMOKE, "experiment=twice"]
    sweeps = [start(*args, warm=True) for _ in range(2)]
    outputs = [sweep.communicate(timeout=900) for sweep in sweeps]
    assert [s.returncode for s in sweeps] == [0, 0], [err[-2000:] for _, err in outputs]
    runs = mlflow_runs("twice")
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    assert [logged_steps(r) for r in runs] == [([5, 10, 15, 20], [10, 20])] * 2           # each step logged once
    text = "".join(out for out, _ in outputs)
    assert "running elsewhere" in text or text.count("skipped") >= 2
