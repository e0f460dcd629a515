"""A damaged file is detected, never trained on: checkpoints, token shards, the tracking store, run folders.

One smoke run trains once (module fixture); each test damages a copy of its DDL_HOME and runs `ddl-run` again.
The token shards' tests need only the dataset: a copy of a home where `ddl-data prepare` made it.
"""

import shutil

import pytest

from tests.conftest import logged_steps, mlflow_runs, run_cli

SMOKE = ["model=micro", "train=smoke"]     # 20 steps: train/loss every 5, val/loss and a checkpoint every 10


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    home = tmp_path_factory.mktemp("trained") / "home"
    out = run_cli("ddl-run", *SMOKE, env_extra={"DDL_HOME": str(home)})
    assert out.returncode == 0, out.stderr[-3000:]
    val_loss = float(out.stdout.split("val/loss ")[-1].split()[0])
    return home, val_loss


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A home holding only the smoke run's dataset (the embedded corpus, bytes: ddl-data's defaults)."""
    home = tmp_path_factory.mktemp("prepared") / "home"
    out = run_cli("ddl-data", "prepare", env_extra={"DDL_HOME": str(home)})
    assert out.returncode == 0, out.stderr[-3000:]
    return home


@pytest.fixture
def home(trained, ddl_home):
    shutil.copytree(trained[0], ddl_home)
    return ddl_home


@pytest.fixture
def data_home(prepared, ddl_home):
    shutil.copytree(prepared, ddl_home)
    return ddl_home


def run_dir(home):
    [found] = (home / "runs").iterdir()
    return found


def curves(experiment="default"):
    """(train/loss steps, val/loss steps) of the experiment's one active run."""
    [run] = mlflow_runs(experiment)
    return logged_steps(run)


def damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "garbled":
        middle = len(data) // 2
        data[middle:middle + 16384] = bytes(range(256)) * 64
    elif how == "truncated":
        data = data[:len(data) // 3]
    else:
        data = b""
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["garbled", "truncated", "empty"])
def test_a_damaged_checkpoint_is_set_aside_and_the_run_resumes_from_the_previous_one(home, trained, how):
    directory = run_dir(home)
    damage(directory / "checkpoints" / "step_00000020.pt", how)
    ended_killed(directory)
    out = run_cli("ddl-run", *SMOKE)
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = [line for line in out.stderr.splitlines() if "step_00000020.pt" in line]
    assert "moved aside as step_00000020.pt.corrupt, using the previous checkpoint" in line
    assert f"val/loss {trained[1]:.4f}" in out.stdout                  # the numbers of the undamaged run
    assert curves() == ([5, 10, 15, 20], [10, 20])                     # each step once, in one run
    assert (directory / "checkpoints" / "step_00000020.pt.corrupt").is_file()


@pytest.mark.parametrize("how", ["garbled", "truncated"])
def test_a_damaged_token_shard_is_one_line_and_creates_no_run(data_home, how):
    [dataset] = [p for p in (data_home / "data").iterdir() if p.is_dir()]
    damage(dataset / "train_0000.bin", how)
    out = run_cli("ddl-run", *SMOKE, "experiment=other", "seed=1")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("ddl-run: error: dataset ") and "shard train_0000.bin is damaged" in line
    assert "ddl-data prepare --force" in line and mlflow_runs("other") == []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["emptied", "deleted"])
def test_a_lost_tracking_store_gets_the_run_back_from_its_folder_in_full(home, trained, how):
    """The journal in the run folder rebuilds the run, curves included; nothing trains again."""
    if how == "emptied":
        (home / "mlflow.db").write_bytes(b"")
    else:
        (home / "mlflow.db").unlink()
    out = run_cli("ddl-run", *SMOKE)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "had lost its run" in out.stdout and "rebuilt from" in out.stdout and "skipped" in out.stdout
    [run] = mlflow_runs("default")
    assert run.info.status == "FINISHED" and run.data.metrics["final/val/loss"] == pytest.approx(trained[1], abs=1e-4)
    assert curves() == ([5, 10, 15, 20], [10, 20])


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["-m"], ["-m", "--dry-run"]], ids=["a run", "a sweep", "a sweep's dry run"])
def test_a_garbled_tracking_store_is_refused_not_replaced(home, flags):
    """A run, and a sweep whose plan asks the store what is done: one line, the store as it was, no sweep folder."""
    sweeps = sorted(p.name for p in (home / "sweeps").iterdir()) if (home / "sweeps").exists() else []
    (home / "mlflow.db").write_bytes(b"not a database at all" * 100)
    pair = ["residual=ddl,baseline"] if flags else []            # a sweep's pair: its power analysis reads the store
    out = run_cli("ddl-run", *flags, *SMOKE, *pair)
    assert out.returncode == 2, out.stderr[-3000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("ddl-run: error: tracking store ") and "not an SQLite database" in line
    assert (home / "mlflow.db").read_bytes() == b"not a database at all" * 100
    assert (sorted(p.name for p in (home / "sweeps").iterdir()) if (home / "sweeps").exists() else []) == sweeps


@pytest.mark.slow
def test_a_deleted_run_folder_is_not_trained_again_while_the_store_holds_the_run(home, trained):
    [before] = mlflow_runs("default")
    shutil.rmtree(run_dir(home))
    out = run_cli("ddl-run", *SMOKE)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "already finished" in out.stdout and "skipped" in out.stdout
    [after] = mlflow_runs("default")
    assert after.info.run_id == before.info.run_id and curves() == ([5, 10, 15, 20], [10, 20])


@pytest.mark.slow
def test_a_killed_run_whose_folder_is_gone_resumes_from_the_stores_checkpoint(home, trained):
    """Its checkpoint artifact comes back, verified, and training goes on from it into a run of its own
    with the killed run's curves up to there: every step once."""
    directory = run_dir(home)
    ended_killed(directory)
    shutil.rmtree(directory)
    out = run_cli("ddl-run", *SMOKE)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "checkpoint of step 20 downloaded" in out.stdout and "sha256 verified" in out.stdout
    assert f"val/loss {trained[1]:.4f}" in out.stdout
    assert curves() == ([5, 10, 15, 20], [10, 20])


def ended_killed(directory):
    """The trained run as a job killed after its last checkpoint leaves it: KILLED, in the store and its journal."""
    from ddl.track import runs
    [run] = mlflow_runs("default")
    runs.TrackedRun(run.info.run_id, directory).terminate("KILLED")
