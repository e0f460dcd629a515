import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

VENV_BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
SLURM_LOCAL = ROOT / "scripts" / "slurm-local"
SLURM_DAEMONS = ("munged", "slurmctld", "slurmd-*", "watchdog")   # the PID files `slurm-local up` writes
# Variables a surrounding SLURM (a job or allocation on a real cluster) sets for its clients.
SLURM_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCONTROL_", "SACCT_")
# Where the device-aware tests (the Triton kernels, bf16, compile) run: DDL_TEST_DEVICE, else CUDA if present.
TEST_DEVICE = torch.device(os.environ.get("DDL_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))


def _share_the_cpus_between(workers: int) -> None:
    """Each pytest-xdist worker, and every process its tests start, computes on its share of the CPUs
    (torch's and OpenMP's threads, DDL_CPUS for a job): with more workers than cores, a worker's
    second thread would only wait for a core another worker holds, and OpenMP's spinning threads
    burn it (an lm-eval test alone 13 s, beside another worker 108 s). Tests of thread counts set
    their own."""
    if workers > 1:
        threads = str(max(1, len(os.sched_getaffinity(0)) // workers))
        for var in ("OMP_NUM_THREADS", "DDL_CPUS"):
            os.environ.setdefault(var, threads)
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cpus_between(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0))

# Outside the private cluster's tests the machine has no SLURM: a SLURM client (the SLURM launcher's dry run asks sinfo
# for the largest node) reads neither the machine's slurm.conf nor the session's decoy, whose unreachable controller
# held each such sinfo to its 15 s timeout. The cluster fixtures set their own.
os.environ["SLURM_CONF"] = "/nonexistent/slurm.conf"


def _warm_server() -> list[str]:
    """The suite's one warm server (ddl.launch.warm), started by the process that configures pytest first (xdist's
    controller, whose workers inherit its DDL_WARM_SOCKET), after the CPU share is in the environment: the
    console scripts run_cli starts, and every local job of their sweeps, fork from it instead of importing
    torch and MLflow again (~5 s of CPU each; a server of its own per worker imported them once more each).
    Returns the command that runs a console script through it; [] where there is none (off Linux), and run_cli
    then starts it cold."""
    from ddl.launch import warm
    if not warm.supported():
        return []
    if not os.environ.get(warm.SOCKET_ENV):
        server, path = warm.start_server()
        atexit.register(server.stdin.close)          # it ends with its last child
        os.environ[warm.SOCKET_ENV] = path
    return [sys.executable, "-S", warm.__file__, os.environ[warm.SOCKET_ENV]]


WARM: list[str] = []    # filled in by pytest_configure


def _import_triton_kernels_interpreted() -> None:
    """Triton decides whether a function is interpreted as it decorates it, on import: its own
    library's (some on a kernel's first launch) and our kernels' (ddl/model/fused/triton_loops.py).
    Their tests run the kernels on CPU tensors under its interpreter, and torch._dynamo imports
    triton as soon as a test imports ddl.model: so without a GPU both are imported, and one kernel
    launched, here first, with TRITON_INTERPRET=1 set for that only (nothing else on CPU runs triton)."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        from ddl.model.fused import triton_loops
        triton_loops.read_forward(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1))  # its first launch imports more
    except ImportError:
        pass                                           # no triton: tests/test_triton_kernels.py skips, saying so
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


def pytest_configure(config):
    """What a process that runs tests sets up once: Triton's kernels interpreted, and the warm server. xdist's
    controller, which runs no test, starts the server its workers share, in their share of the CPUs; no process
    multiprocessing spawns, which imports a test module (and so this file) without configuring pytest."""
    if config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput"):
        _share_the_cpus_between(config.getoption("numprocesses") or 0)
        _warm_server()
        return
    if TEST_DEVICE.type == "cpu":
        _import_triton_kernels_interpreted()
    WARM[:] = _warm_server()


# The suite runs on three pytest-xdist workers (make test). The tests that start private servers run in two
# groups, each on one worker, in the order written: the SLURM cluster with its decoy system files (each started
# once, and the decoy /etc/slurm/slurm.conf is one file) and the team's MLflow server (started once). The tests
# of a module that builds a module-scoped fixture of its own (a sweep trained once, a UI server) run on one
# worker too, so that it is built once, not once per worker.
SERVER_GROUPS = {"slurm": ({"slurm_cluster", "system_slurm_decoys"},
                           {"test_slurm.py", "test_slurm_gpu.py", "test_slurm_private.py"}),
                 "team": ({"team_server"}, {"test_team.py", "test_team_server.py"})}


def _server_group(item) -> str | None:
    fixtures = set(getattr(item, "fixturenames", ()))
    return next((group for group, (names, modules) in SERVER_GROUPS.items()
                 if names & fixtures or item.path.name in modules), None)


def _uses_own_module_fixture(item) -> bool:
    module = item.nodeid.split("::")[0]
    return any(fixture.scope == "module" and fixture.baseid == module
               for name in getattr(item, "fixturenames", ())
               for fixture in item._fixtureinfo.name2fixturedefs.get(name, ()))


@pytest.hookimpl(tryfirst=True)     # before xdist's own hook reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        if group := _server_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
        elif _uses_own_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


def pytest_runtest_setup(item):
    """Under --dist loadgroup, xdist schedules by the group it writes into each test's id: a pytest whose ids
    ignore that write spreads the server tests over both workers (pyproject pins one that does not)."""
    if (getattr(item.config.option, "loadgroup", False) and item.get_closest_marker("xdist_group")   # set on workers
            and "@" not in item.nodeid):
        pytest.fail(f"--dist loadgroup: the xdist group is not in the test id; pytest {pytest.__version__} with "
                    "this pytest-xdist cannot keep the server tests on one worker", pytrace=False)


def slow_except(params: dict, *fast: str) -> list:
    """A parametrization's values by id, each marked slow but those named `fast`: make test-fast keeps one
    representative of a costly parametrized test, make test runs them all."""
    return [pytest.param(value, id=name, marks=() if name in fast else pytest.mark.slow)
            for name, value in params.items()]


@pytest.fixture(scope="module")
def float64_default():
    """float64 as torch's default dtype for a whole module (`pytestmark = usefixtures(...)`)."""
    import torch
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


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


def console_script(tool: str) -> list[str]:
    """The command that runs an installed console script forked from the worker's warm server, for a test that
    starts it itself. Not for one the test signals (but SIGKILL) or whose process group it signals: the client
    forwards a signal to the script alone, and the script's children are not in its process group."""
    return [*WARM, str(VENV_BIN / tool)]


def python_module(module: str) -> list[str]:
    """`python -m MODULE`, forked from the worker's warm server as console_script's scripts are."""
    return [*(WARM or [sys.executable]), "-m", module]


def python_script(path: Path) -> list[str]:
    """`python PATH`, forked from the worker's warm server as console_script's scripts are."""
    return [*(WARM or [sys.executable]), str(path)]


def run_cli(tool: str, *args: str, cwd=None, timeout=600, env_extra=None) -> subprocess.CompletedProcess:
    """Run an installed console script (ddl-run, ddl-report, ...) the way a user does, its output to a file: the
    width of tables is a file's (the caller's COLUMNS, as a CI runner may export, is not passed on). It runs
    forked from the worker's warm server (its imports done once), as `python SCRIPT ARGS` would."""
    inherited = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([*console_script(tool), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**inherited, "PYTHONUNBUFFERED": "1", **(env_extra or {})})


def mlflow_runs(experiment: str):
    from ddl.track import store
    c = store.client()
    exp = c.get_experiment_by_name(experiment)
    return [] if exp is None else c.search_runs([exp.experiment_id])


@dataclass
class SlurmCluster:
    """A private cluster from `scripts/slurm-local up`: everything under `dir`, clients read `conf`."""
    dir: Path
    conf: Path
    pids: dict          # name -> PID of what `up` started (daemons and their children, the watchdog)

    def env(self) -> dict:
        return {"DDL_SLURM_DIR": str(self.dir), "SLURM_CONF": str(self.conf)}

    def alive(self) -> list:
        return [f"{name}:{pid}" for name, pid in self.pids.items() if _running(pid)]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"   # zombies have ended
    except (OSError, IndexError):
        return False


def _children(pid: int) -> list:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def slurm_up(directory: Path, shape: dict | None = None) -> SlurmCluster:
    """`scripts/slurm-local up` in `directory`, ended by a watchdog if this process dies first;
    skips where SLURM cannot run here (exit 3: not root, no apt-get). `shape`: a declared node
    (DDL_SLURM_NODE_CPUS, DDL_SLURM_FAKE_GPUS) instead of this host's, or two (DDL_SLURM_NODES=2)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith((*SLURM_ENV_PREFIXES, "DDL_SLURM_"))}
    up = subprocess.run([str(SLURM_LOCAL), "up", "--until-exit", str(os.getpid())], capture_output=True,
                        text=True, timeout=600, env={**env, **(shape or {}), "DDL_SLURM_DIR": str(directory)})
    if up.returncode == 3:
        pytest.skip(f"no SLURM here: {up.stdout.strip()}")
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"export SLURM_CONF={directory}/slurm.conf" in up.stdout, up.stdout
    pids = {}
    for pid_file in (found for pattern in SLURM_DAEMONS for found in sorted(directory.glob(f"{pattern}.pid"))):
        name = pid_file.stem
        pids[name] = int(pid_file.read_text())
        for child in _children(pids[name]) if name != "watchdog" else ():   # slurmctld's slurmscriptd
            pids[f"{name}/{child}"] = child
    assert len([name for name in pids if "/" not in name]) == len(SLURM_DAEMONS) - 1 + int((shape or {}).get(
        "DDL_SLURM_NODES", 1)), pids
    return SlurmCluster(directory, directory / "slurm.conf", pids)


def slurm_down(cluster: SlurmCluster) -> subprocess.CompletedProcess:
    """`scripts/slurm-local down` for this cluster; then none of the processes `up` started may run."""
    down = subprocess.run([str(SLURM_LOCAL), "down"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **cluster.env()})
    deadline = time.time() + 10
    while cluster.alive() and time.time() < deadline:
        time.sleep(0.1)
    assert down.returncode == 0 and not cluster.alive(), f"slurm-local down left {cluster.alive()}: {down.stdout}"
    return down


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The suite's private SLURM cluster (scripts/slurm-local in a pytest tmp dir), up once per
    session; in each test that uses it (`_slurm_environment`), SLURM_CONF points every client (sbatch,
    squeue, ddl-run, submitit) at it and a surrounding SLURM's variables are cleared, while the other
    tests of its worker keep the missing SLURM_CONF. Torn down by the PIDs it started, also on Ctrl-C or
    SIGTERM (turned into KeyboardInterrupt, on which pytest runs this finaliser), at interpreter
    exit (atexit) and, if pytest is killed outright, by the watchdog `up --until-exit` leaves."""
    if shutil.which("bash") is None:
        pytest.skip("no bash for scripts/slurm-local")
    cluster = slurm_up(tmp_path_factory.mktemp("slurm"))
    done = []

    def teardown():
        if not done:
            done.append(True)
            slurm_down(cluster)

    atexit.register(teardown)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield cluster
    finally:
        signal.signal(signal.SIGTERM, previous)
        atexit.unregister(teardown)
        teardown()


@pytest.fixture(autouse=True)
def _slurm_environment(request, monkeypatch):
    """A test that uses the private cluster talks to it: SLURM_CONF is its conf and a surrounding SLURM's variables
    are cleared, for that test alone. Set for the session, it reached the worker's later tests too: a SLURM dry run
    there asked the cluster's 2-CPU node for its size."""
    if "slurm_cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("slurm_cluster")
    for var in [v for v in os.environ if v.startswith(SLURM_ENV_PREFIXES)]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))


@dataclass
class SlurmDecoys:
    """What a machine's own SLURM would have: /etc/slurm/slurm.conf and a process named slurmd."""
    conf: Path
    conf_bytes: bytes
    conf_mtime_ns: int
    process: subprocess.Popen

    def disturbed(self) -> list:
        problems = []
        if not self.conf.exists():
            problems.append(f"{self.conf} removed")
        elif self.conf.read_bytes() != self.conf_bytes or self.conf.stat().st_mtime_ns != self.conf_mtime_ns:
            problems.append(f"{self.conf} changed")
        if self.process.poll() is not None:
            problems.append(f"decoy slurmd {self.process.pid} ended ({self.process.returncode})")
        return problems


DECOY_HEADER = b"# a decoy system slurm.conf (tests/conftest.py); the private cluster must neither read nor write it\n"


def _decoy_conf() -> bytes:
    return DECOY_HEADER + f"# written by pytest PID {os.getpid()}\n".encode() + \
        b"ClusterName=system-decoy\nSlurmctldHost=decoy-host(192.0.2.1)\n"


def _leftover_decoy(conf: Path) -> bool:
    """A decoy a killed session left behind (its PID is gone); a running session's is only watched."""
    text = conf.read_bytes()
    if not text.startswith(DECOY_HEADER):
        return False
    pid = text.split(b"PID ", 1)[1].split(b"\n", 1)[0] if b"PID " in text else b""
    return not (pid.isdigit() and _running(int(pid)))


def _die_with_parent():      # the decoy process ends with pytest, even if pytest is killed
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG


@pytest.fixture(scope="session")
def system_slurm_decoys(tmp_path_factory):
    """A decoy system SLURM for the session, set up before the private cluster and checked after it
    is torn down: /etc/slurm/slurm.conf (a decoy written only where none exists, then removed; an
    existing file is only watched, unless it is a decoy a killed session left) and a running copy
    of sleep named slurmd."""
    conf = Path("/etc/slurm/slurm.conf")
    created_dir = not conf.parent.exists()
    decoy = _decoy_conf()
    try:
        if conf.exists() and _leftover_decoy(conf):
            conf.unlink()
        if not conf.exists():
            conf.parent.mkdir(parents=True, exist_ok=True)
            with open(conf, "xb") as f:
                f.write(decoy)
            os.utime(conf, ns=(1_000_000_000 * 10**9, 1_000_000_000 * 10**9))   # an old mtime: any write shows
    except PermissionError:
        pytest.skip(f"cannot write a decoy {conf} (not root)")
    slurmd = tmp_path_factory.mktemp("decoy") / "slurmd"
    shutil.copy2(shutil.which("sleep"), slurmd)
    process = subprocess.Popen([str(slurmd), "3600"], preexec_fn=_die_with_parent)
    decoys = SlurmDecoys(conf, conf.read_bytes(), conf.stat().st_mtime_ns, process)
    try:
        yield decoys
        problems = decoys.disturbed()
        assert not problems, f"the system SLURM decoys were disturbed: {problems}"
    finally:
        process.kill()
        process.wait()
        if conf.exists() and conf.read_bytes() == decoy:         # ours: never remove someone else's file
            conf.unlink()
            if created_dir:
                with contextlib.suppress(OSError):
                    conf.parent.rmdir()


def logged_steps(run, keys=("train/loss", "val/loss")) -> tuple[list[int], ...]:
    """The steps of the run's points for each key, sorted: a step logged twice shows twice."""
    from ddl.track import store
    c = store.client()
    return tuple(sorted(m.step for m in c.get_metric_history(run.info.run_id, key)) for key in keys)


COLOURS = re.compile(r"\x1b\[[0-9;]*m|\x1b\][^\x07]*\x07")
CURSOR = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")       # moves and erases: what was drawn ends there


def run_cli_in_terminal(tool: str, *args: str, columns: int = 80, timeout=600, env_extra=None) -> tuple[int, str]:
    """Run a console script on a pseudo-terminal `columns` wide, as a user at a terminal does: (exit code, what
    it drew, colours taken out and each cursor move or erase a line break)."""
    import pty
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": str(columns), "TERM": "xterm", **(env_extra or {})}
    process = subprocess.Popen([*console_script(tool), *args], stdin=follower, stdout=follower, stderr=follower,
                               env=env, close_fds=True)
    os.close(follower)
    chunks, deadline = [], time.time() + timeout
    try:
        while time.time() < deadline:
            try:
                chunk = os.read(leader, 65536)
            except OSError:         # the terminal closed: every process on it has ended
                break
            if not chunk:
                break
            chunks.append(chunk)
        returncode = process.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
            process.wait()
    return returncode, CURSOR.sub("\n", COLOURS.sub("", b"".join(chunks).decode(errors="replace")))


def assert_two_ranks_trained(sweeps: Path, steps: int = 20) -> None:
    """A 2-task DDP job's own logs (submitit's, one per task): each rank joined one gloo group of
    world size 2, and rank 0 logged the last step."""
    [rank0] = sweeps.rglob("*_0_log.out")
    [rank1] = sweeps.rglob("*_1_log.out")                                     # rank 1's own process
    assert "rank 1/2: joined the gloo process group" in rank1.read_text()
    assert "rank 0/2: joined the gloo process group" in rank0.read_text()
    assert f"step {steps}/{steps}" in rank0.read_text()


# A private MLflow team server (scripts/mlflow-team): PostgreSQL behind `mlflow server --serve-artifacts`.

MLFLOW_TEAM = ROOT / "scripts" / "mlflow-team"


def _process_group(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue
        if group == str(pgid) and state != "Z":
            members.append(int(stat.parent.name))
    return members


def _team_server_pids(directory: Path) -> dict:
    """The MLflow server's processes: the `mlflow server` PID `up` recorded and its process group (uvicorn)."""
    leader = int((directory / "mlflow.pid").read_text())
    return {"mlflow": leader, **{f"mlflow/{pid}": pid for pid in _process_group(leader) if pid != leader}}


@dataclass
class TeamServer:
    """A private team server from `scripts/mlflow-team up`: PostgreSQL and `mlflow server --serve-artifacts`
    at `uri`, its artifacts under `dir/artifacts`, everything under `dir`."""
    dir: Path
    uri: str
    pids: dict          # name -> PID of what `up` started (postgres and its children, the server's group, the watchdog)

    def env(self) -> dict:
        return {"DDL_TEAM_DIR": str(self.dir), "DDL_TEAM_PYTHON": sys.executable}

    def script(self, *args: str) -> subprocess.CompletedProcess:
        """`scripts/mlflow-team <args>` on this server's directory."""
        return subprocess.run([str(MLFLOW_TEAM), *args], capture_output=True, text=True, timeout=300,
                              env={**os.environ, **self.env()})

    def alive(self) -> list:
        return [f"{name}:{pid}" for name, pid in self.pids.items() if _running(pid)]

    def credentials(self) -> dict:
        """The admin's basic-auth variables (a server started with `up --auth`)."""
        password = (self.dir / "admin-password").read_text().strip()
        return {"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": password}

    def stop_server(self) -> None:
        """Stop only the MLflow server (an outage; PostgreSQL runs on): its processes are gone on return."""
        server = {name: pid for name, pid in self.pids.items() if name.startswith("mlflow")}
        stopped = self.script("stop-server")
        left = [f"{name}:{pid}" for name, pid in server.items() if _running(pid)]
        assert stopped.returncode == 0 and not left, f"stop-server left {left}: {stopped.stdout}{stopped.stderr}"

    def start_server(self) -> None:
        """Start the MLflow server again, on the same port; it answers on return."""
        started = self.script("start-server")
        assert started.returncode == 0, started.stdout + started.stderr
        self.pids = {name: pid for name, pid in self.pids.items() if not name.startswith("mlflow")}
        self.pids.update(_team_server_pids(self.dir))


def team_up(directory: Path, auth: bool = False) -> TeamServer:
    """`scripts/mlflow-team up` in `directory` (with `--auth`: MLflow's basic-auth app), ended by a watchdog if
    this process dies first; skips where it cannot run here (exit 3: no PostgreSQL, no psycopg2)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDL_TEAM_", "MLFLOW_TRACKING_"))}
    up = subprocess.run([str(MLFLOW_TEAM), "up", *(["--auth"] if auth else []), "--until-exit", str(os.getpid())],
                        capture_output=True, text=True, timeout=300,
                        env={**env, "DDL_TEAM_DIR": str(directory), "DDL_TEAM_PYTHON": sys.executable})
    if up.returncode == 3:
        pytest.skip(f"no team server here: {up.stdout.strip()}")
    assert up.returncode == 0, up.stdout + up.stderr
    [uri] = re.findall(r"^export MLFLOW_TRACKING_URI=(\S+)$", up.stdout, re.M)
    postgres = int((directory / "postgres.pid").read_text())
    pids = {"postgres": postgres, **{f"postgres/{child}": child for child in _children(postgres)},
            **_team_server_pids(directory), "watchdog": int((directory / "watchdog.pid").read_text())}
    return TeamServer(directory, uri, pids)


def team_down(server: TeamServer) -> subprocess.CompletedProcess:
    """`scripts/mlflow-team down` for this server; then none of the processes `up` started may run."""
    down = server.script("down")
    deadline = time.time() + 10
    while server.alive() and time.time() < deadline:
        time.sleep(0.1)
    assert down.returncode == 0 and not server.alive(), f"mlflow-team down left {server.alive()}: {down.stdout}"
    return down


@contextlib.contextmanager
def private_team_server(auth: bool = False):
    """A team server in a new directory under the system's temp dir (PostgreSQL runs as the `postgres` user,
    who cannot enter pytest's private tmp dirs), torn down by the PIDs it started and removed: on leaving,
    on Ctrl-C or SIGTERM (turned into KeyboardInterrupt), at interpreter exit (atexit) and, if this process
    is killed outright, by the watchdog `up --until-exit` leaves."""
    import tempfile
    if shutil.which("bash") is None:
        pytest.skip("no bash for scripts/mlflow-team")
    directory = Path(tempfile.mkdtemp(prefix="ddl-team-"))
    done = []

    def teardown():
        if not done:
            done.append(True)
            try:
                if server:
                    team_down(server)
            finally:
                shutil.rmtree(directory, ignore_errors=True)

    server = None
    atexit.register(teardown)
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server = team_up(directory, auth)
        yield server
    finally:
        signal.signal(signal.SIGTERM, previous)
        atexit.unregister(teardown)
        teardown()


@pytest.fixture(scope="session")
def team_server():
    """The suite's private team server (PostgreSQL + `mlflow server --serve-artifacts` on 127.0.0.1), up once
    per session. It sets no variable: a test points a process at it with `MLFLOW_TRACKING_URI=team_server.uri`;
    `stop_server()` / `start_server()` take the MLflow server down and up again on the same port."""
    with private_team_server() as server:
        yield server
