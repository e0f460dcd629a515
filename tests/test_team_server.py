"""The team server (scripts/mlflow-team): a private PostgreSQL behind `mlflow server --serve-artifacts`, run
and stopped by its own PIDs; a run logged through it lands in PostgreSQL and its artifacts in the server's
artifact store; with basic-auth, the right login logs, a wrong one is one line and the password is written
nowhere a run leaves things."""

import contextlib
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import MLFLOW_TEAM, _running, private_team_server, run_cli
from tests.test_slurm import SLURM

# Every test on a server is marked slow: the first to run starts it (10-20 s on 2 cores).
SMOKE = ["model=micro", "train=smoke", "train.steps=20"]


def query(server, sql: str, *params) -> list[tuple]:
    """Rows of `sql` in the server's MLflow database, read as MLflow's role over TCP (its password from pgpass)."""
    import psycopg2
    settings = dict(line.split("=", 1) for line in (server.dir / "team.env").read_text().split())
    with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=settings["PG_PORT"], user="mlflow",
                                             dbname="mlflow", passfile=str(server.dir / "pgpass"))) as db:
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()


def experiment_runs(server, experiment: str) -> list[tuple]:
    """(run id, status, artifact URI) of the experiment's runs, from PostgreSQL."""
    return query(server, "SELECT r.run_uuid, r.status, r.artifact_uri FROM runs r JOIN experiments e "
                         "USING (experiment_id) WHERE e.name = %s", experiment)


def stored_artifacts(server, artifact_uri: str) -> Path:
    """Where the server keeps a run's proxied artifacts (`mlflow-artifacts:/<experiment>/<run>/artifacts`)."""
    assert artifact_uri.startswith("mlflow-artifacts:/"), artifact_uri
    return server.dir / "artifacts" / artifact_uri.removeprefix("mlflow-artifacts:/")


def answers(uri: str) -> bool:
    try:
        urllib.request.urlopen(f"{uri}/health", timeout=10).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_a_run_logged_through_the_server_lands_in_postgresql_and_its_artifact_store(team_server, ddl_home):
    out = run_cli("ddl-run", *SMOKE, "experiment=team-store", env_extra={"MLFLOW_TRACKING_URI": team_server.uri})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [(run_id, status, artifact_uri)] = experiment_runs(team_server, "team-store")
    steps = query(team_server, "SELECT step FROM metrics WHERE run_uuid = %s AND key = 'train/loss' ORDER BY step",
                  run_id)
    assert status == "FINISHED" and steps and steps[-1] == (20,), (status, steps)
    stored = stored_artifacts(team_server, artifact_uri)
    assert (stored / "config.yaml").is_file() and (stored / "train.log").is_file(), sorted(stored.rglob("*"))
    assert not (ddl_home / "mlflow.db").exists() and not (ddl_home / "mlartifacts").exists()


@pytest.mark.slow
def test_the_server_stops_and_starts_again_on_its_port_postgresql_untouched(team_server):
    """stop_server() / start_server(): an outage of the MLflow server alone; it comes back on the same URI
    with what PostgreSQL holds."""
    import json
    postgres = team_server.pids["postgres"]
    team_server.stop_server()
    assert not answers(team_server.uri) and _running(postgres)
    assert query(team_server, "SELECT name FROM experiments WHERE name = 'Default'") == [("Default",)]
    team_server.start_server()
    with urllib.request.urlopen(f"{team_server.uri}/api/2.0/mlflow/experiments/search?max_results=1000") as answer:
        names = {e["name"] for e in json.load(answer)["experiments"]}
    assert names == {name for (name,) in query(team_server, "SELECT name FROM experiments "
                                                            "WHERE lifecycle_stage = 'active'")}
    assert team_server.pids["postgres"] == postgres and not [
        name for name in team_server.pids if name.startswith("mlflow") and not _running(team_server.pids[name])]


@pytest.mark.slow
def test_status_and_down_act_on_what_their_own_directory_names(team_server, tmp_path):
    """status names the running server's PIDs and URI, a second `up` starts nothing, and `down` in a directory
    whose PID files name other processes (a copy of sleep named postgres, the session server's own PIDs)
    signals none of them. (That `down` stops all that `up` started is checked as each server goes: team_down.)"""
    status = team_server.script("status")
    assert status.returncode == 0, status.stdout + status.stderr
    for name in ("postgres", "mlflow", "watchdog"):
        assert f"{name}: running (PID {team_server.pids[name]})" in status.stdout
    assert f"export MLFLOW_TRACKING_URI={team_server.uri}" in status.stdout
    again = team_server.script("up")
    assert again.returncode == 0 and "already up" in again.stdout and team_server.uri in again.stdout

    decoy_binary = tmp_path / "postgres"
    shutil.copy2(shutil.which("sleep"), decoy_binary)
    decoy = subprocess.Popen([str(decoy_binary), "600"])
    stale = Path(tempfile.mkdtemp(prefix="ddl-team-"))
    env = {**os.environ, "DDL_TEAM_DIR": str(stale)}
    try:
        for name, pid in (("postgres", decoy.pid), ("mlflow", team_server.pids["mlflow"]),
                          ("watchdog", team_server.pids["postgres"])):
            (stale / f"{name}.pid").write_text(f"{pid}\n")
        status = subprocess.run([str(MLFLOW_TEAM), "status"], capture_output=True, text=True, env=env, timeout=60)
        assert status.returncode == 1 and f"mlflow-team: down ({stale})" in status.stdout, status.stdout
        down = subprocess.run([str(MLFLOW_TEAM), "down"], capture_output=True, text=True, env=env, timeout=60)
        assert down.returncode == 0 and "stopped nothing" in down.stdout, down.stdout + down.stderr
        assert decoy.poll() is None, "down signalled a process its directory does not name"
        assert all(_running(team_server.pids[name]) for name in ("postgres", "mlflow", "watchdog"))
        assert answers(team_server.uri)
    finally:
        shutil.rmtree(stale)
        decoy.kill()
        decoy.wait()


@pytest.fixture(scope="module")
def auth_server():
    """A second private server, with MLflow's basic-auth app (`up --auth`)."""
    with private_team_server(auth=True) as server:
        yield server


@pytest.mark.slow
def test_basic_auth_the_right_login_logs_and_a_wrong_one_is_one_line(auth_server, ddl_home, monkeypatch):
    login = auth_server.credentials()
    wrong = {**login, "MLFLOW_TRACKING_PASSWORD": "not-the-password"}
    out = run_cli("ddl-run", *SMOKE, "experiment=team-auth", env_extra={"MLFLOW_TRACKING_URI": auth_server.uri,
                                                                        **wrong})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert lines[0] == (f"ddl-run: error: MLFLOW_TRACKING_URI={auth_server.uri}: the server did not accept "
                        f"MLFLOW_TRACKING_USERNAME=admin with its MLFLOW_TRACKING_PASSWORD (HTTP 401); check both")
    assert "not-the-password" not in out.stdout + out.stderr
    assert not (ddl_home / "mlflow.db").exists() and not any((ddl_home / "runs").glob("*"))
    assert experiment_runs(auth_server, "team-auth") == []

    from ddl.track import store                   # no login at all: the same check, in this process
    monkeypatch.setenv("MLFLOW_TRACKING_URI", auth_server.uri)
    for variable in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(store.StoreError, match=r"the server asks for a login \(HTTP 401\); set "
                                               r"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD$"):
        store.check()

    out = run_cli("ddl-run", *SMOKE, "experiment=team-auth", env_extra={"MLFLOW_TRACKING_URI": auth_server.uri,
                                                                        **login})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    [(_, status, _)] = experiment_runs(auth_server, "team-auth")
    assert status == "FINISHED"


def files_holding(secret: str, *roots: Path) -> list[str]:
    """Every file under `roots` whose bytes hold `secret`."""
    return [str(path) for root in roots for path in root.rglob("*")
            if path.is_file() and secret.encode() in path.read_bytes()]


@pytest.mark.slow
def test_the_password_is_nowhere_a_slurm_run_leaves(auth_server, system_slurm_decoys, slurm_cluster, ddl_home,
                                                    tmp_path):
    """A SLURM job logging to the basic-auth server: its params, tags, artifacts, train.log, the job script
    submitit writes, Hydra's files, the report and the server's log never hold the password."""
    login = auth_server.credentials()
    password = login["MLFLOW_TRACKING_PASSWORD"]
    env = {"MLFLOW_TRACKING_URI": auth_server.uri, **login}
    # seed=1: a signature of its own, which no other test's run on this server lets it reuse
    out = run_cli("ddl-run", "-m", *SMOKE, *SLURM, "seed=1", "experiment=team-secret", env_extra=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [(run_id, status, artifact_uri)] = experiment_runs(auth_server, "team-secret")
    assert status == "FINISHED", status
    job_scripts = list((ddl_home / "sweeps").rglob("*_submission.sh"))
    assert job_scripts and all("#SBATCH" in p.read_text() for p in job_scripts)   # what sbatch was given
    assert list(ddl_home.rglob("train.log"))
    report = run_cli("ddl-report", "--experiment", "team-secret", "--out", str(tmp_path / "reports"), env_extra=env)
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    assert any((tmp_path / "reports").rglob("*.md"))

    values = query(auth_server, "SELECT value FROM params WHERE run_uuid = %s UNION ALL "
                                "SELECT value FROM tags WHERE run_uuid = %s", run_id, run_id)
    assert values and not [v for (v,) in values if password in v]
    assert ("ddl.launcher", "slurm") in query(auth_server, "SELECT key, value FROM tags WHERE run_uuid = %s", run_id)
    assert any(stored_artifacts(auth_server, artifact_uri).rglob("train.log"))
    # The server's whole directory (its database files, logs, artifact store) holds it in its own 0600 file only.
    assert files_holding(password, auth_server.dir) == [str(auth_server.dir / "admin-password")]
    assert not files_holding(password, ddl_home, tmp_path / "reports")
    assert password not in out.stdout + out.stderr + report.stdout + report.stderr


# SQLite on a network filesystem (ddl/track/filesystems.py). Lines as the kernel writes them (proc(5)): a
# cluster node's root, home on NFS 4 with a local disk mounted below it, Lustre scratch, GPFS, a CIFS share
# whose mount point holds a space (\040), and two mounts stacked on /data (the last one hides the first).
CLUSTER_MOUNTINFO = "\n".join([
    "29 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw,errors=remount-ro",
    "36 29 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=65822836k,nr_inodes=16455709,mode=755",
    "98 29 0:52 / /home rw,relatime shared:50 - nfs4 fileserver:/export/home rw,vers=4.2,rsize=1048576,"
    "wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.1.2.3,local_lock=none,"
    "addr=10.1.0.5",
    "99 98 8:17 / /home/alice/fast rw,relatime shared:51 - xfs /dev/sdb1 rw,attr2,inode64,noquota",
    "120 29 0:60 / /lustre/scratch rw,relatime shared:60 - lustre 10.0.0.1@o2ib:10.0.0.2@o2ib:/scratch "
    "rw,flock,lazystatfs,encrypt",
    "130 29 0:70 / /gpfs/fs1 rw,relatime shared:70 - gpfs fs1 rw",
    r"140 29 0:80 / /mnt/lab\040share rw,relatime shared:80 - cifs //nas/lab rw,vers=3.1.1,cache=strict,"
    "username=svc,uid=0,noforceuid,gid=0,noforcegid,addr=10.1.0.9,file_mode=0755,dir_mode=0755,soft,nounix",
    "150 29 8:18 / /data rw,relatime shared:90 - ext4 /dev/sdb2 rw",
    "151 150 0:90 / /data rw,relatime shared:91 - nfs nas:/data rw,vers=3,addr=10.1.0.9",
])


def test_mountinfo_gives_the_type_of_the_deepest_mount_containing_a_path():
    from ddl.track.filesystems import Mount, filesystem_type, parse_mountinfo
    mounts = parse_mountinfo(CLUSTER_MOUNTINFO)
    assert mounts[0] == Mount("/", "ext4") and Mount("/mnt/lab share", "cifs") in mounts and len(mounts) == 9
    assert {path: filesystem_type(Path(path), CLUSTER_MOUNTINFO) for path in (
        "/home/alice/ddl", "/home", "/homework/ddl", "/home/alice/fast/ddl", "/lustre/scratch/alice/ddl",
        "/gpfs/fs1/ddl", "/mnt/lab share/ddl", "/data/ddl", "/tmp/ddl")} == {
        "/home/alice/ddl": "nfs4", "/home": "nfs4", "/homework/ddl": "ext4", "/home/alice/fast/ddl": "xfs",
        "/lustre/scratch/alice/ddl": "lustre", "/gpfs/fs1/ddl": "gpfs", "/mnt/lab share/ddl": "cifs",
        "/data/ddl": "nfs", "/tmp/ddl": "ext4"}


def test_this_machines_mountinfo_agrees_with_findmnt(tmp_path):
    from ddl.track.filesystems import MOUNTINFO, filesystem_type
    if shutil.which("findmnt") is None:
        pytest.skip("no findmnt (util-linux) to compare with")
    for path in (tmp_path, Path("/proc/self"), Path("/dev/shm"), Path(__file__)):
        findmnt = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(path)], capture_output=True, text=True)
        assert filesystem_type(path, MOUNTINFO.read_text()) == findmnt.stdout.split()[-1], path   # the top of a stack


def test_sqlite_under_slurm_on_a_network_filesystem_gets_one_warning_line(monkeypatch):
    from ddl.track.filesystems import sqlite_on_network_warning
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for home, fstype in (("/lustre/scratch/alice/ddl", "lustre"), ("/home/alice/ddl", "nfs4"),
                         ("/gpfs/fs1/ddl", "gpfs"), ("/mnt/lab share/ddl", "cifs")):
        monkeypatch.setenv("DDL_HOME", home)
        [line] = sqlite_on_network_warning("slurm", CLUSTER_MOUNTINFO).splitlines()
        assert line.startswith(f"ddl-run: warning: DDL_HOME={home} is on {fstype}, where SQLite")
        assert "scripts/mlflow-team" in line and "set MLFLOW_TRACKING_URI in every home" in line
        assert sqlite_on_network_warning("local", CLUSTER_MOUNTINFO) is None        # one machine's jobs: SQLite copes
    monkeypatch.setenv("DDL_HOME", "/home/alice/fast/ddl")                          # a local disk under NFS home
    assert sqlite_on_network_warning("slurm", CLUSTER_MOUNTINFO) is None
    monkeypatch.setenv("DDL_HOME", "/home/alice/ddl")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.lab:5000")          # a server: nothing to warn of
    assert sqlite_on_network_warning("slurm", CLUSTER_MOUNTINFO) is None
