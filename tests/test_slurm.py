"""The cluster path against a real, private SLURM (scripts/slurm-local): sbatch jobs, failures, requeue."""

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import assert_two_ranks_trained, mlflow_runs, run_cli

SLURM = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=20"]
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


def _requeue_when_running(ddl_home: Path, min_step: int, done: list):
    deadline = time.time() + 240
    while time.time() < deadline:
        for status_file in (ddl_home / "runs").glob("*/status.json"):
            try:
                state = json.loads(status_file.read_text())
            except (ValueError, OSError):
                continue
            if state.get("step", 0) >= min_step:
                [job_id] = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
                subprocess.run(["scontrol", "requeue", job_id], check=True)
                for _ in range(120):                # SLURM holds a requeued job (BeginTime): release it
                    state_now = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                                               text=True).stdout.strip()
                    if state_now == "PENDING":
                        subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True)
                        break
                    time.sleep(0.5)
                done.append((job_id, state["step"]))
                return
        time.sleep(0.5)


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

