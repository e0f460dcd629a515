"""The cluster path against a real, private SLURM (scripts/slurm-local): sbatch jobs, failures, requeue."""

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import assert_two_ranks_trained, logged_steps, mlflow_runs, run_cli
from tests.test_faults import as_a_terminal_job, start, wait_for

# The prepare job a sweep submits when its dataset is missing, on one CPU of the private cluster's 2-CPU node
# (its defaults, 32 CPUs and 64 GB, are lowered to the whole node: test_slurm_data.py).
PREPARE = ["hydra.launcher.prepare_cpus_per_task=1", "hydra.launcher.prepare_mem_gb=2",
           "hydra.launcher.prepare_timeout_min=20"]
SLURM = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=20", *PREPARE]
MICRO = ["model=micro", "train=smoke"]


@pytest.fixture
def slurm(system_slurm_decoys, slurm_cluster):
    """The session's private cluster (SLURM_CONF set), with the decoy system SLURM beside it."""
    return slurm_cluster


@pytest.mark.slow
def test_a_sweep_runs_as_real_sbatch_jobs_and_a_failure_is_failed(slurm, ddl_home):
    out = run_cli("ddl-run", "-m", "residual=ddl,baseline", *MICRO, *SLURM, "model.init=gpt2",
                  "model.init_std=0.02,1e15", "experiment=slurm")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 finished, 0 skipped, 2 failed" in out.stdout
    runs = mlflow_runs("slurm")
    assert sorted(r.info.status for r in runs) == ["FAILED", "FAILED", "FINISHED", "FINISHED"]
    assert all(r.data.tags["ddl.launcher"] == "slurm" and r.data.tags["ddl.slurm_job_id"].isdigit() for r in runs)
    assert all(r.data.tags["ddl.error"].startswith("NonFiniteLoss") for r in runs if r.info.status == "FAILED")


def test_a_job_slurm_would_keep_pending_for_ever_is_cancelled_with_the_key_to_change(slurm, ddl_home):
    """More CPUs a task than the node has: SLURM keeps the jobs pending (PartitionConfig) and never says no; the
    sweep cancels them once silent for DDL_LOST_AFTER_S, each with its line, and none is left in the queue."""
    out = run_cli("ddl-run", "-m", "residual=ddl,baseline", *MICRO, *SLURM, "hydra.launcher.cpus_per_task=64",
                  "experiment=stuck", env_extra={"DDL_LOST_AFTER_S": "2", "COLUMNS": "400"})
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    line = ("was cancelled: SLURM keeps it pending for ever (PartitionConfig): it asks more than the partition's "
            "nodes have: lower hydra.launcher.cpus_per_task, mem_gb or gpus_per_node, or set hydra.launcher.partition")
    assert " ".join(out.stdout.split()).count(line) == 2 and "0 finished, 0 skipped, 2 failed" in out.stdout
    assert _squeue("-h", "-t", "pending") == "" and mlflow_runs("stuck") == []


def test_a_slurm_client_that_refuses_is_a_warning_line_and_a_job_that_started_is_not(slurm, capsys):
    from ddl.launch import data_jobs
    done = subprocess.run(["sbatch", "--parsable", "--wait", "-o", "/dev/null", "--wrap", "true"], capture_output=True,
                          text=True, check=True).stdout.strip()
    data_jobs.release([done])                      # it ended: nothing left to release, nothing to say
    data_jobs.release(["999999"])
    data_jobs.cancel(["abc"])
    said = capsys.readouterr().err.splitlines()
    assert said == ["ddl-run: warning: scontrol of job 999999 failed (Invalid job id specified for job 999999): "
                    "clear it by hand: scontrol update JobId=999999 Dependency=",
                    "ddl-run: warning: scancel of job abc failed (scancel: error: Invalid job id abc): SLURM ends "
                    "them itself (--kill-on-invalid-dep=yes), or scancel them"], said


@pytest.mark.slow
def test_a_two_task_slurm_job_trains_with_ddp_ranks_from_submitit(slurm, ddl_home):
    """tasks_per_node=2: one sbatch job, srun starts two tasks, each joins DDP from the environment
    submitit's TorchDistributedEnvironment exports from SLURM's (ranks, world size, master)."""
    out = run_cli("ddl-run", "-m", *MICRO, *SLURM, "hydra.launcher.tasks_per_node=2", "train.batch_tokens=512",
                  "experiment=slurm_ddp", timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [run] = mlflow_runs("slurm_ddp")
    assert run.info.status == "FINISHED" and run.data.tags["ddl.launcher"] == "slurm"
    job_id = run.data.tags["ddl.slurm_job_id"]
    [job_dir] = (ddl_home / "sweeps" / "slurm_ddp").rglob(f".submitit/{job_id}")
    assert_two_ranks_trained(job_dir)


def _squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True).stdout.strip()


def _job_ids(ddl_home: Path) -> list[str]:
    """The SLURM jobs this home's sweeps submitted (submitit's folder for each), oldest first."""
    return sorted((p.name for p in (ddl_home / "sweeps").rglob(".submitit/*") if p.name.isdigit()), key=int)


def _job_at_step(ddl_home: Path, min_step: int) -> tuple[str, int] | None:
    """(the home's newest SLURM job, its step) once the run's status file is at `min_step`; None if it never is."""
    deadline = time.time() + 240
    while time.time() < deadline:
        for status_file in (ddl_home / "runs").glob("*/status.json"):
            try:
                state = json.loads(status_file.read_text())
            except (ValueError, OSError):
                continue
            if state.get("step", 0) >= min_step:
                return _job_ids(ddl_home)[-1], state["step"]
        time.sleep(0.5)
    return None


def _requeue_when_running(ddl_home: Path, min_step: int, done: list):
    found = _job_at_step(ddl_home, min_step)
    if found is None:
        return
    job_id = found[0]
    subprocess.run(["scontrol", "requeue", job_id], check=True)
    for _ in range(120):                # SLURM holds a requeued job (BeginTime): release it
        if _squeue("-j", job_id, "-o", "%T") == "PENDING":
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)
            break
        time.sleep(0.5)
    done.append(found)


@pytest.mark.slow
def test_a_requeued_job_resumes_and_ends_like_an_uninterrupted_run(slurm, ddl_home, tmp_path, monkeypatch):
    train = ["train.steps=150", "train.eval_every=50", "train.ckpt_every=1000", "train.log_every=5",
             "train.batch_tokens=4096", "train.micro_batch=32", "train.seq_len=128"]   # > KillWait after step 40
    reference = run_cli("ddl-run", *MICRO, *train, "experiment=reference")  # uninterrupted, another DDL_HOME below
    assert reference.returncode == 0
    [ref_run] = mlflow_runs("reference")
    monkeypatch.setenv("DDL_HOME", str(tmp_path / "cluster"))
    requeued: list = []
    watcher = threading.Thread(target=_requeue_when_running, args=(tmp_path / "cluster", 40, requeued))
    watcher.start()
    out = run_cli("ddl-run", "-m", *MICRO, *train, *SLURM, "experiment=preempt")
    watcher.join()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert requeued, "the job finished before it could be requeued"
    [run] = mlflow_runs("preempt")                                    # one run, continued after the requeue
    assert run.info.status == "FINISHED" and run.data.tags.get("ddl.resumed") == "true"
    assert run.data.metrics["final/val/loss"] == ref_run.data.metrics["final/val/loss"]
    log = next((tmp_path / "cluster" / "runs").glob("*/train.log")).read_text()
    assert log.count("step    150") == 1 and log.count("step     40") == 1



def _cancel_when_running(ddl_home: Path, min_step: int, done: list):
    found = _job_at_step(ddl_home, min_step)
    if found is not None:
        subprocess.run(["scancel", found[0]], check=True)
        done.append(time.monotonic())


@pytest.mark.slow
def test_a_job_the_cluster_lost_ends_the_sweep_and_a_rerun_resumes_it(slurm, ddl_home):
    """scancel mid-run on a cluster without accounting (sacct cannot say the job ended): the sweep reports
    the job lost seconds later (DDL_LOST_AFTER_S=3), its run KILLED, and exits 1; the same sweep run again
    resumes it from the checkpoint its SIGTERM left, every step logged once."""
    sweep = ["ddl-run", "-m", *MICRO, *SLURM, "train.steps=60", "train.batch_tokens=2048", "train.micro_batch=16",
             "train.seq_len=128", "train.ckpt_every=1000", "experiment=lost"]
    cancelled: list = []
    canceller = threading.Thread(target=_cancel_when_running, args=(ddl_home, 15, cancelled))
    canceller.start()
    out = run_cli(*sweep, env_extra={"DDL_LOST_AFTER_S": "3"}, timeout=300)
    ended = time.monotonic()
    canceller.join()
    said = out.stdout + out.stderr
    assert cancelled, "the job finished before it could be cancelled"
    assert out.returncode == 1 and ended - cancelled[0] < 150, said[-6000:]     # not the run_cli timeout's 300 s
    assert "left the queue without a result (cancelled); re-run the sweep to resume it" in out.stdout
    assert "ddl-run: 1 of 1 job failed (1 lost: run the sweep again to resume)" in out.stderr
    assert "left running" not in said and "sacct" not in said and "accounting" not in said
    [run] = mlflow_runs("lost")
    assert run.info.status == "KILLED" and run.data.tags["ddl.error"].startswith("left the queue without a result")
    [checkpoint] = (ddl_home / "runs").glob("*/checkpoints/step_*.pt")      # SIGTERM's, before SLURM's SIGKILL
    again = run_cli(*sweep, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    [run] = mlflow_runs("lost")
    assert run.info.status == "FINISHED" and run.data.tags["ddl.resumed"] == "true"
    assert logged_steps(run, ("train/loss",)) == (list(range(5, 61, 5)),)
    assert 15 <= int(checkpoint.stem.removeprefix("step_")) < 60


def _prepared() -> None:
    """The embedded dataset prepared in DDL_HOME first, so that the sweep's first sbatch is a training job's
    (no prepare job before it: tests/test_slurm_data.py has those)."""
    out = run_cli("ddl-data", "prepare")
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.slow
def test_ctrl_c_while_a_job_is_submitted_stops_the_sweep(slurm, ddl_home, tmp_path):
    """SIGINT at the moment of submission (an sbatch on PATH that sends it to the sweep, then runs the real
    one): the sweep takes it once the job is queued, submits nothing more and exits 130, leaving the queued
    job to the cluster. A sweep that ignored SIGINT while it submitted lost it and trained both jobs."""
    _prepared()
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nkill -INT $PPID\nexec {shutil.which('sbatch')} \"$@\"\n")
    wrapper.chmod(0o755)
    sweep = start("ddl-run", "-m", "residual=ddl,baseline", *MICRO, *SLURM, "experiment=interrupted",
                  env_extra={"PATH": f"{wrapper.parent}:{os.environ['PATH']}"}, preexec_fn=as_a_terminal_job)
    try:
        out, err = sweep.communicate(timeout=300)
    finally:
        for job_id in _job_ids(ddl_home):
            subprocess.run(["scancel", job_id], check=False)
    assert sweep.returncode == 130, out[-3000:] + err[-3000:]
    assert len(_job_ids(ddl_home)) == 1, out[-3000:]
    assert "left running" in out and "not started" in out and "Traceback" not in err, out[-3000:] + err[-3000:]


@pytest.mark.slow
def test_ctrl_c_does_not_call_a_job_the_cluster_lost_left_running(slurm, ddl_home, monkeypatch):
    """A job cancelled as soon as it is queued, then Ctrl-C before the sweep gives it up by itself: its
    summary row says lost, not `left running on the cluster`."""
    monkeypatch.setenv("DDL_LOST_AFTER_S", "600")
    _prepared()
    sweep = start("ddl-run", "-m", *MICRO, *SLURM, "experiment=stopped", preexec_fn=as_a_terminal_job)
    wait_for(lambda: _job_ids(ddl_home) or sweep.poll() is not None, timeout=120)
    [job_id] = _job_ids(ddl_home)
    subprocess.run(["scancel", job_id], check=True)
    wait_for(lambda: _squeue("-t", "all", "-j", job_id, "-o", "%T") == "CANCELLED", timeout=300)
    sweep.send_signal(signal.SIGINT)
    out, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 130, out[-3000:] + err[-3000:]
    assert "left the queue without a result (cancelled)" in out and "left running" not in out
