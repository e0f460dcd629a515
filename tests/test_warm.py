"""Warm starts (ddl.launch.warm): a child forked from the warm server runs as `python ARGS` would, signals reach
it, a killed client takes it down, no server means a cold start, and a sweep's jobs forked from its own server
compute what cold jobs compute."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ddl.launch import warm

from .conftest import WARM, mlflow_runs, run_cli
from .test_faults import wait_for

pytestmark = pytest.mark.skipif(not WARM, reason="warm starts are Linux only")

SCRIPT = """
import os, signal, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("WARM_TEST_VAR"),
      "blocked", sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])), flush=True)
print("to stderr", file=sys.stderr)
if sys.argv[1] == "wait":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
    Path = __import__("pathlib").Path
    Path(sys.argv[2]).write_text(str(os.getpid()))
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return path


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "WARM_TEST_VAR": "seen"})


def test_a_warm_child_prints_exits_and_sees_what_a_cold_python_does(script, tmp_path):
    cold = _run([sys.executable, str(script), "3", "x y"], tmp_path)
    hot = _run([*WARM, str(script), "3", "x y"], tmp_path)
    assert (hot.returncode, hot.stdout, hot.stderr) == (cold.returncode, cold.stdout, cold.stderr) == \
        (3, f"argv ['3', 'x y'] cwd {tmp_path} var seen blocked []\n", "to stderr\n")


def test_an_uncaught_error_is_reported_from_the_scripts_own_frame(tmp_path):
    (tmp_path / "fails.py").write_text("raise ValueError('no such thing')\n")
    hot = _run([*WARM, str(tmp_path / "fails.py")], tmp_path)
    assert hot.returncode == 1
    assert hot.stderr.splitlines()[1].startswith(f'  File "{tmp_path / "fails.py"}", line 1')
    assert hot.stderr.splitlines()[-1] == "ValueError: no such thing"


def test_a_blocked_signal_stays_blocked_in_the_child(script, tmp_path):
    """A sweep's jobs start with SIGINT blocked (ddl.launch.submission._children_ignore_sigint): so do warm ones."""
    code = ("import signal, subprocess, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
            "sys.exit(subprocess.run(sys.argv[1:]).returncode)")
    hot = _run([sys.executable, "-c", code, *WARM, str(script), "0"], tmp_path)
    assert f"blocked [{int(signal.SIGINT)}]" in hot.stdout


def test_sigterm_reaches_the_child_and_a_killed_client_takes_its_child_down(script, tmp_path):
    for sig, expected in ((signal.SIGTERM, 7), (signal.SIGKILL, -signal.SIGKILL)):
        pid_file = tmp_path / f"pid-{sig}"
        client = subprocess.Popen([*WARM, str(script), "wait", str(pid_file)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert child != client.pid
        client.send_signal(sig)
        assert client.wait(timeout=60) == expected
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"the child of a client ended by {sig.name} still runs"


def test_without_a_server_the_client_starts_python_cold(script, tmp_path):
    command = [sys.executable, "-S", warm.__file__, str(tmp_path / "no-server"), str(script), "5"]
    assert _run(command, tmp_path).returncode == 5


@pytest.mark.slow
def test_a_sweep_forks_its_jobs_from_a_server_of_its_own_and_they_compute_what_cold_jobs_do(tmp_path, monkeypatch):
    """Without the suite's server (DDL_WARM_SOCKET), a local sweep of two jobs starts its own: the jobs are its
    children, their losses are the cold jobs' bit for bit, and it ends with the sweep (its folder gone)."""
    env = {k: v for k, v in os.environ.items() if k != warm.SOCKET_ENV}
    args = ["-m", "model=micro", "train=smoke", "train.steps=6", "seed=0,1", "experiment=warm"]
    before = set(Path(tempfile.gettempdir()).glob("ddl-warm-*"))
    sweep = subprocess.Popen([str(Path(sys.executable).parent / "ddl-run"), *args, "hydra.launcher.warm_start=true"],
                             env={**env, "DDL_HOME": str(tmp_path / "warm")}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    forked = set()
    while sweep.poll() is None:
        servers = [pid for pid in _children(sweep.pid) if "ddl.launch.warm" in _cmdline(pid)]
        forked |= {pid for server in servers for pid in _children(server)}
        time.sleep(0.05)
    assert sweep.returncode == 0, sweep.stdout.read()
    assert len(forked) >= 2, "the jobs did not run as children of the sweep's warm server"
    cold = run_cli("ddl-run", *args, "hydra.launcher.warm_start=false",
                   env_extra={"DDL_HOME": str(tmp_path / "cold"), warm.SOCKET_ENV: ""})
    assert cold.returncode == 0, cold.stderr

    def losses(home):
        monkeypatch.setenv("DDL_HOME", str(tmp_path / home))
        return sorted(r.data.metrics["val/loss"] for r in mlflow_runs("warm"))
    assert losses("warm") == losses("cold") and len(losses("cold")) == 2
    deadline = time.monotonic() + 30
    while set(Path(tempfile.gettempdir()).glob("ddl-warm-*")) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(Path(tempfile.gettempdir()).glob("ddl-warm-*")) - before


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


JOB = "import os, sys; print(len(os.listdir('/proc/self/task')), 'torch' in sys.modules, os.getppid())\n"


def test_a_job_whose_start_up_environment_differs_from_the_servers_starts_cold_saying_why(tmp_path):
    """What torch, OpenMP, BLAS or Python read as the server imported them is the server's: a job that sets another
    value (OMP_NUM_THREADS) starts cold, its log saying why; a job of the server's values is forked (torch imported,
    one thread)."""
    (tmp_path / "job.py").write_text(JOB)
    path = WARM[-1]
    other = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)
    forked = _run([*WARM, str(tmp_path / "job.py")], tmp_path)
    threads, imported, _ = forked.stdout.split()
    assert (threads, imported, forked.stderr) == ("1", "True", "")
    cold = subprocess.run([*WARM, str(tmp_path / "job.py")], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": other}, timeout=120)
    assert cold.stdout.split()[1] == "False"
    assert cold.stderr == (f"ddl warm start: this job starts cold: the job's OMP_NUM_THREADS={other} differs from the "
                           f"server's OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}, which torch, "
                           f"OpenMP, BLAS or Python read as it started\n")
    assert warm.probe(path, {**os.environ, "TORCH_LOGS": "dynamo"}).startswith("the job's TORCH_LOGS=dynamo differs")
    assert warm.probe(path, dict(os.environ)) is None


def test_the_server_forks_only_while_it_runs_one_thread(tmp_path):
    """The server imports with OpenBLAS and jemalloc asked for no threads of their own, so it runs one thread and
    forks; a server whose environment lets OpenBLAS start its pool (OPENBLAS_NUM_THREADS=2) starts every job cold."""
    for env, one_thread in (({}, True), ({"OPENBLAS_NUM_THREADS": "2"}, False)):
        environment = {k: v for k, v in os.environ.items() if k != warm.SOCKET_ENV} | env
        path = tmp_path / f"server{len(env)}" / "socket"          # a folder of its own, which the server removes
        path.parent.mkdir()
        server = subprocess.Popen([sys.executable, "-m", "ddl.launch.warm", "serve", str(path)],
                                  stdin=subprocess.PIPE, env=environment)
        try:
            wait_for(lambda path=path, server=server: path.exists() or server.poll() is not None, timeout=60)
            reason = warm.probe(str(path), environment)         # answered once its imports are done
            if one_thread:
                assert reason is None and len(os.listdir(f"/proc/{server.pid}/task")) == 1
            else:
                assert reason.startswith("the server runs ") and reason.endswith(" threads, and a fork keeps one")
        finally:
            server.stdin.close()
            server.wait(60)


@pytest.mark.slow
def test_a_searchs_rounds_fork_from_one_server_and_a_sweep_says_why_its_jobs_start_cold(tmp_path):
    """A search's two rounds of one trial each (a launch of one job used to start cold) fork from one server of the
    search's own; a sweep whose environment differs from the suite server's says, before its jobs, why they start
    cold."""
    env = {k: v for k, v in os.environ.items() if k != warm.SOCKET_ENV}
    args = ["-m", "residual=baseline", "train.lr=tag(log, interval(1e-3, 1e-2))", "tune.trials=2", "tune.parallel=1",
            "tune.replicates=1", "tune.seeds=1", "tune.bracket_trials=0", "model=micro", "train=smoke",
            "train.steps=6", "experiment=warm-search", "hydra.launcher.warm_start=true"]
    search = subprocess.Popen([str(Path(sys.executable).parent / "ddl-run"), *args],
                              env={**env, "DDL_HOME": str(tmp_path / "search")}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    servers, forked = set(), set()
    while search.poll() is None:
        found = [pid for pid in _children(search.pid) if "ddl.launch.warm" in _cmdline(pid)]
        servers |= set(found)
        forked |= {pid for server in found for pid in _children(server)}
        time.sleep(0.05)
    said = search.stdout.read()
    assert search.returncode == 0 and said.count("search round: 1 trial") == 2, said[-3000:]
    assert len(servers) == 1 and len(forked) >= 2, (servers, forked)
    other = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)
    sweep = run_cli("ddl-run", "-m", "model=micro", "train=smoke", "train.steps=2", "seed=0,1", "experiment=cold",
                    env_extra={"DDL_HOME": str(tmp_path / "cold"), "OMP_NUM_THREADS": other})
    assert sweep.returncode == 0 and (f"ddl-run: jobs start cold, not forked from the warm server: the job's "
                                      f"OMP_NUM_THREADS={other} differs") in sweep.stdout, sweep.stdout[-3000:]
