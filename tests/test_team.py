"""A team on one server: homes that share nothing but a real MLflow server (PostgreSQL, proxied artifacts).

The server is the source of truth: what it holds FINISHED is not trained again by any home, another
home's runs are never replaced, checkpoints travel with their runs, and an outage loses nothing.
"""

import fcntl
import json
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from tests.conftest import VENV_BIN, console_script, run_cli
from tests.test_slurm import SLURM

MICRO = ["model=micro", "train=smoke", "train.steps=30"]


def home_env(server, home, **extra) -> dict:
    return {"DDL_HOME": str(home), "MLFLOW_TRACKING_URI": server.uri, **extra}


def server_runs(server, experiment: str):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(server.uri)
    found = client.get_experiment_by_name(experiment)
    return client, ([] if found is None else client.search_runs([found.experiment_id]))


def curve(client, run, key="train/loss"):
    """(step, value) of every point of the run's curve: a step logged twice shows twice."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


@pytest.mark.slow
def test_homes_sharing_a_server_train_each_job_once_and_evaluate_and_report_each_others_runs(
        team_server, slurm_cluster, system_slurm_decoys, tmp_path):
    """Home a trains a sweep on the private SLURM cluster; home b's same sweep trains nothing and leaves a's
    runs as they were; with a's folder gone, b evaluates a's run from its checkpoint artifact, and a third
    home that shares no file with a writes the same report."""
    a, b, c = (tmp_path / name for name in "abc")
    sweep = ["-m", "residual=ddl,baseline", *MICRO, "experiment=team"]
    first = run_cli("ddl-run", *sweep, *SLURM, env_extra={**home_env(team_server, a), **slurm_cluster.env()})
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "2 finished, 0 skipped" in first.stdout
    client, trained = server_runs(team_server, "team")
    assert sorted(r.info.status for r in trained) == ["FINISHED", "FINISHED"]
    assert all(r.info.artifact_uri.startswith("mlflow-artifacts:/") for r in trained)
    curves = {r.info.run_id: curve(client, r) for r in trained}

    second = run_cli("ddl-run", *sweep, env_extra=home_env(team_server, b))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "0 finished, 2 skipped" in second.stdout and "trained by" in second.stdout
    assert not (b / "runs").exists() or not list((b / "runs").rglob("step_*.pt"))      # b trained nothing
    client, after = server_runs(team_server, "team")
    assert {r.info.run_id: r.info.status for r in after} == {r.info.run_id: "FINISHED" for r in trained}
    assert {r.info.run_id: curve(client, r) for r in after} == curves

    a_report, c_report = tmp_path / "report_a", tmp_path / "report_c"
    assert run_cli("ddl-report", "--experiment", "team", "--out", str(a_report),
                   env_extra=home_env(team_server, a)).returncode == 0
    signature = next(r for r in trained if r.data.params["model.residual"] == "ddl").data.tags["ddl.signature"]
    shutil.rmtree(a)
    evaluated = run_cli("ddl-eval", signature, "--tasks", "ddl_continuation", "--limit", "5",
                        env_extra=home_env(team_server, b))
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    assert "sha256 verified" in evaluated.stdout and "logged to MLflow run(s)" in evaluated.stdout
    client, scored = server_runs(team_server, "team")
    assert any("eval/0shot/ddl_continuation/reported" in r.data.metrics for r in scored)

    reported = run_cli("ddl-report", "--experiment", "team", "--out", str(c_report), env_extra=home_env(team_server, c))
    assert reported.returncode == 0, reported.stdout[-3000:] + reported.stderr[-3000:]
    for table in (a_report / "team").glob("*.csv"):
        if "eval" not in table.name:     # the evaluation came after a's report
            assert (c_report / "team" / table.name).read_text() == table.read_text(), table.name
    assert {p.name for p in (a_report / "team").glob("*.png")} <= {p.name for p in (c_report / "team").glob("*.png")}


@pytest.mark.slow
def test_a_run_another_home_is_training_is_left_to_it(team_server, tmp_path):
    """A RUNNING run with a fresh heartbeat from another home: the sweep says who trains it, and trains nothing."""
    env_a = home_env(team_server, tmp_path / "a")
    job = ["model=micro", "train=smoke", "train.steps=4000", "train.eval_every=1000", "train.ckpt_every=1000",
           "experiment=busy"]
    busy = subprocess.Popen([*console_script("ddl-run"), *job], env={**os.environ, **env_a},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any(r.info.status == "RUNNING"
                                                 for r in server_runs(team_server, "busy")[1]):
            time.sleep(1)
        other = run_cli("ddl-run", "-m", *job, env_extra=home_env(team_server, tmp_path / "b", COLUMNS="300"))
        assert other.returncode == 0, other.stdout[-3000:] + other.stderr[-3000:]
        assert f"{socket.gethostname()}, {tmp_path / 'a'}; not started here" in other.stdout
        assert "1 running elsewhere" in other.stdout
        assert not list((tmp_path / "b").rglob("step_*.pt"))
    finally:
        busy.terminate()
        busy.wait(timeout=120)


def await_lock_waiter(path, process, timeout_s: float = 180) -> None:
    """Until `process` waits for the flock held on `path` (a `->` line of /proc/locks on the file's inode)."""
    inode = os.stat(path).st_ino
    deadline = time.time() + timeout_s
    while not any("->" in line and line.split()[-3].endswith(f":{inode}") for line in open("/proc/locks")):
        assert process.poll() is None and time.time() < deadline, "the job never waited for the lock"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_home_that_loses_the_race_for_a_job_leaves_no_running_run_anywhere(team_server, tmp_path):
    """Another home starts the job between this home's look at the server and the creation of its own run (held
    there: the job waits to prepare its data): the run created second is ended KILLED, tagged with the home it
    lost to, then deleted, so neither the server's trash nor a store rebuilt from the home's journal shows it
    RUNNING."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    from ddl.launch import status
    from ddl.launch.job import Job
    from ddl.track import store
    from ddl.track.journal import Journal
    from tests.test_launch import _compose
    home, args = tmp_path / "b", [*MICRO, "seed=3", "experiment=race"]
    job = Job.from_config(_compose(args))
    data_lock = home / "data" / f"{job.run.data.dataset_name()}.lock"
    data_lock.parent.mkdir(parents=True)
    client = MlflowClient(team_server.uri)
    experiment = client.create_experiment("race")
    with open(data_lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)                   # as another process preparing the same data would
        racer = subprocess.Popen([*console_script("ddl-run"), *args], env={**os.environ, **home_env(team_server, home)},
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        await_lock_waiter(data_lock, racer)                # it found no rival and sets up to train
        rival = client.create_run(experiment, tags={
            store.SIGNATURE_TAG: job.signature, store.HOME_ID_TAG: "rival", store.HOME_TAG: "/rival/home",
            "ddl.host": "rival-host", store.HEARTBEAT_TAG: str(int(time.time()))}).info.run_id
    try:
        out, _ = racer.communicate(timeout=300)
        assert racer.returncode == 0, out[-3000:]
        assert "running elsewhere (rival-host, /rival/home); left to it" in out, out[-3000:]
        runs = {r.info.run_id: r for r in client.search_runs([experiment], run_view_type=ViewType.ALL)}
        [lost] = [r for run_id, r in runs.items() if run_id != rival]
        assert (lost.info.lifecycle_stage, lost.info.status) == ("deleted", "KILLED") and lost.info.end_time
        assert lost.data.tags[store.LOST_CLAIM_TAG] == "to rival-host, /rival/home, which started first"
        run_dir = home / "runs" / job.signature
        history = Journal(run_dir).runs()[lost.info.run_id]
        assert (history.status, history.deleted) == ("KILLED", True)
        assert status.read(run_dir).get("state") != "running" and not list(home.rglob("step_*.pt"))
        for target in (team_server.uri, f"sqlite:///{tmp_path / 'rebuilt.db'}"):
            synced = run_cli("ddl-track", "sync", "--to", target, env_extra=home_env(team_server, home))
            assert synced.returncode == 0 and "0 runs created, 0 updated, 0 up to date, 0 conflicts, 1 skipped" \
                in synced.stdout, synced.stdout + synced.stderr
        after = client.search_runs([experiment], run_view_type=ViewType.ALL)
        assert [r.info.run_id for r in after if r.info.status == "RUNNING"] == [rival]
    finally:
        racer.kill()
        client.set_terminated(rival, "KILLED")    # no later job of this signature waits for it


@pytest.mark.slow
def test_a_sweep_survives_a_server_outage_and_every_step_reaches_it_once(team_server, tmp_path):
    """The MLflow server stops for 30 s while two jobs train: no job dies, the points logged meanwhile wait
    and arrive once, and the sweep's output says what happened."""
    home = tmp_path / "home"
    steps = 600     # a few seconds of training into the outage, then the checkpoint at 300 waits out its end
    sweep = ["-m", "residual=ddl,baseline", "model=micro", "train=smoke", f"train.steps={steps}", "train.log_every=20",
             "train.eval_every=300", "train.ckpt_every=300", "experiment=outage"]
    outage = {}

    def take_the_server_down():
        deadline = time.time() + 300
        while time.time() < deadline and not any(json.loads(p.read_text()).get("step", 0) >= 40
                                                 for p in home.glob("runs/*/status.json")):
            time.sleep(0.5)
        team_server.stop_server()
        outage["stopped"] = time.time()
        time.sleep(30)
        team_server.start_server()
        outage["started"] = time.time()

    downtime = threading.Thread(target=take_the_server_down)
    downtime.start()
    out = run_cli("ddl-run", *sweep, env_extra=home_env(team_server, home, DDL_PROGRESS_S="5"))
    downtime.join()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert outage["started"] - outage["stopped"] >= 30
    assert "2 finished" in out.stdout and "was unreachable for" in out.stdout
    client, runs = server_runs(team_server, "outage")
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]
    for run in runs:
        assert [step for step, _ in curve(client, run)] == list(range(20, steps + 1, 20))
        assert [step for step, _ in curve(client, run, "val/loss")] == [300, 600]


READER = """
import os, sys, time
from mlflow.tracking import MlflowClient
client, errors, reads = MlflowClient(sys.argv[1]), 0, 0
while not os.path.exists(sys.argv[3]):            # until the test says the sweep is over
    try:
        found = client.get_experiment_by_name(sys.argv[2])
        for run in client.search_runs([found.experiment_id]) if found else []:
            client.get_metric_history(run.info.run_id, "train/loss")
            reads += 1
    except Exception as err:
        errors += 1
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
    time.sleep(2)
print(f"{reads} {errors}")
"""


@pytest.mark.slow
def test_four_jobs_and_four_readers_at_once_against_the_server(team_server, tmp_path):
    """4 jobs (2 at a time, in two rounds) log while 4 processes read through the REST API, each going over every
    run's curve every 2 s: no error anywhere, and every run holds each of its steps once."""
    stop = tmp_path / "stop"
    readers = [subprocess.Popen([str(VENV_BIN / "python"), "-c", READER, team_server.uri, "load", str(stop)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        out = run_cli("ddl-run", "-m", "seed=range(4)", "model=micro", "train=smoke", "train.warmup_steps=5",
                      "hydra.launcher.max_parallel=2", "experiment=load",
                      env_extra=home_env(team_server, tmp_path / "home"))
    finally:
        stop.touch()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "4 finished, 0 skipped, 0 failed" in out.stdout
    for reader in readers:
        stdout, stderr = reader.communicate(timeout=120)
        reads, errors = map(int, stdout.split())
        assert reader.returncode == 0 and errors == 0 and reads > 4, stderr[-2000:]
    client, runs = server_runs(team_server, "load")
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert [step for step, _ in curve(client, run)] == [5, 10, 15, 20]
        assert [step for step, _ in curve(client, run, "val/loss")] == [10, 20]


@pytest.mark.slow
def test_a_server_that_stays_down_fails_the_job_in_one_line_with_its_checkpoint_intact(team_server, tmp_path):
    home = tmp_path / "home"
    job = ["model=micro", "train=smoke", "train.steps=3000", "train.ckpt_every=100", "train.eval_every=100",
           "seed=7", "experiment=down"]        # seed 7: not the outage test's job, which the server holds FINISHED
    env = {**os.environ, **home_env(team_server, home, DDL_STORE_PATIENCE_S="5", MLFLOW_HTTP_REQUEST_MAX_RETRIES="1",
                                    MLFLOW_HTTP_REQUEST_TIMEOUT="5")}
    running = subprocess.Popen([*console_script("ddl-run"), *job], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not list(home.glob("runs/*/checkpoints/step_*.pt")):
            time.sleep(0.5)
        team_server.stop_server()
        stdout, stderr = running.communicate(timeout=300)
    finally:
        running.kill()
        team_server.start_server()
    assert running.returncode == 1, stdout[-2000:] + stderr[-2000:]
    [line] = [line for line in stderr.splitlines() if line.startswith("ddl-run: error:")]
    assert f"MLFLOW_TRACKING_URI={team_server.uri}: unreachable for over 5 s" in line
    assert "Traceback" not in stderr
    from ddl.train import checkpoint
    [run_dir] = (home / "runs").iterdir()
    path, state = checkpoint.newest_intact(run_dir)
    assert state["step"] >= 100 and path.is_file()
