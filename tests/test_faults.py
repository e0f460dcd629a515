"""What was logged survives: SIGKILL, SIGTERM and Ctrl-C of a run or a sweep, a full disk, `ddl-ui` stopped by PID.

After any kill and resume MLflow holds exactly one point per logged step, as an uninterrupted run does; an
interrupted job ends KILLED, and the sweep prints its summary.
"""

import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from tests.conftest import VENV_BIN, console_script, logged_steps, mlflow_runs, run_cli

SMOKE = ["model=micro", "train=smoke", "train.log_every=1"]     # 20 steps, every one logged


def start(*args, env_extra=None, warm=False, **popen):
    """A console script started (cold, or forked from the warm server: conftest.console_script) and not waited for."""
    command = console_script(args[0]) if warm else [str(VENV_BIN / args[0])]
    return subprocess.Popen([*command, *args[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}, **popen)


def wait_for(condition, timeout=600):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def steps(home) -> list[int]:
    """The step each run's status file shows."""
    found = []
    for path in (home / "runs").glob("*/status.json"):
        try:
            found.append(json.loads(path.read_text()).get("step") or 0)
        except ValueError:   # replaced while read
            found.append(0)
    return found


def our_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ddl-run")]


@pytest.mark.slow
def test_sigkill_after_a_checkpoint_then_resume_logs_every_step_exactly_once(ddl_home):
    job = start("ddl-run", *SMOKE)
    wait_for(lambda: any((ddl_home / "runs").glob("*/checkpoints/step_00000010.pt")))
    job.kill()
    job.communicate()
    out = run_cli("ddl-run", *SMOKE)
    assert out.returncode == 0, out.stderr[-3000:]
    [run] = mlflow_runs("default")
    assert run.info.status == "FINISHED" and logged_steps(run) == (list(range(1, 21)), [10, 20])
    [run_dir] = (ddl_home / "runs").iterdir()      # one line says where it resumed, in its output and its log
    said = re.compile(rf"ddl_dv1-micro-s0 \[{run_dir.name}\]: resumed from step (\d+) "
                      rf"\({re.escape(str(run_dir / 'checkpoints'))}/step_0*(\d+)\.pt\)")
    for text in (out.stdout, (run_dir / "train.log").read_text()):
        [line] = [line for line in text.splitlines() if "resumed" in line]
        step, in_file = said.fullmatch(line).groups()
        assert step == in_file != "0", line


@pytest.mark.slow
def test_sigterm_stops_a_run_killed_in_one_line_and_it_resumes(ddl_home):
    job = start("ddl-run", *SMOKE)
    wait_for(lambda: max(steps(ddl_home), default=0) >= 3)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=600)
    assert job.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err[-3000:]
    [line] = our_lines(err)
    assert "stopped by SIGTERM at step" in line and "run the same command to resume" in line
    [run] = mlflow_runs("default")
    assert run.info.status == "KILLED"
    assert run_cli("ddl-run", *SMOKE).returncode == 0
    [run] = mlflow_runs("default")
    assert run.info.status == "FINISHED" and logged_steps(run) == (list(range(1, 21)), [10, 20])


@pytest.mark.slow
def test_a_run_under_cuda_graphs_mode_is_killed_and_resumes(ddl_home):
    """train.compile_mode=reduce-overhead takes the same path on CPU as on CUDA (each step marked for the graphs,
    evaluation its own shapes), where inductor records no graphs: a run killed after a checkpoint resumes and logs
    every step once."""
    graphs = ["model=micro", "train=smoke", "train.steps=60", "train.ckpt_every=5", "train.eval_every=30",
              "train.log_every=1", "train.compile=true", "train.compile_mode=reduce-overhead"]
    job = start("ddl-run", *graphs)
    wait_for(lambda: any((ddl_home / "runs").glob("*/checkpoints/step_*.pt")) or job.poll() is not None)
    job.kill()
    _, err = job.communicate()
    assert job.returncode == -signal.SIGKILL, err[-3000:]
    out = run_cli("ddl-run", *graphs)
    assert out.returncode == 0 and "resumed from step" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    [run] = mlflow_runs("default")
    assert run.info.status == "FINISHED" and logged_steps(run) == (list(range(1, 61)), [30, 60])


def as_a_terminal_job():
    """In the child, before exec: Ctrl-C as a terminal delivers it (a background shell starts its jobs
    ignoring SIGINT, and an ignored signal is inherited). With start_new_session, its own process group."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_a_sweeps_process_group_ends_its_jobs_killed_with_a_summary(ddl_home, signum):
    sweep = start("ddl-run", "-m", "residual=ddl,baseline", *SMOKE, "train.steps=5000", "experiment=stopped",
                  start_new_session=True, preexec_fn=as_a_terminal_job)
    wait_for(lambda: len(steps(ddl_home)) == 2 and min(steps(ddl_home)) >= 2)
    os.killpg(sweep.pid, signum)
    out, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 128 + signum and "Traceback" not in err, err[-3000:]
    assert "ddl-run: summary" in out and out.count("killed") >= 2, out[-3000:]
    name = signal.Signals(signum).name
    assert our_lines(err) == [f"ddl-run: stopped by {name}; its jobs resume when it is run again"]
    assert sorted(r.info.status for r in mlflow_runs("stopped")) == ["KILLED", "KILLED"]
    assert {json.loads(p.read_text())["state"] for p in (ddl_home / "runs").glob("*/status.json")} == {"killed"}


@pytest.fixture
def small_disk(ddl_home):
    """runs/ on a 2 MB tmpfs: the first checkpoint (1.4 MB) fits, the second does not."""
    runs = ddl_home / "runs"
    runs.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(runs)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield runs
    subprocess.run(["umount", str(runs)], check=True)


@pytest.mark.slow
def test_a_full_disk_fails_the_run_in_one_line_and_keeps_the_older_checkpoint(ddl_home, small_disk):
    from ddl.train import checkpoint
    out = run_cli("ddl-run", *SMOKE)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    [line] = our_lines(out.stderr)
    assert line.startswith("ddl-run: error: ") and "No space left on device" in line
    [run] = mlflow_runs("default")
    assert run.info.status == "FAILED" and "No space left on device" in run.data.tags["ddl.error"]
    assert not list(small_disk.rglob("*.tmp"))
    [kept] = small_disk.glob("*/checkpoints/step_*.pt")
    assert kept.name == "step_00000010.pt" and checkpoint.load(kept)["step"] == 10       # verifies its checksum


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_ddl_ui_stopped_by_pid_takes_its_server_along(ddl_home):
    port = free_port()
    ui = start("ddl-ui", "--port", str(port))
    for line in ui.stdout:
        if "Ctrl-C to stop." in line:
            break
    assert serving(port)
    ui.send_signal(signal.SIGTERM)
    ui.communicate(timeout=60)
    assert ui.returncode == 0
    wait_for(lambda: not serving(port), timeout=120)
