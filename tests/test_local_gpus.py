"""The local launcher on a workstation's GPUs, on CPU: the sweep's shell names GPUs through CUDA_VISIBLE_DEVICES
(indices of GPUs that are not there; the jobs, finding no CUDA, train on CPU) and each job's tasks get their own."""

import re
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import assert_two_ranks_trained, mlflow_runs, run_cli

SMOKE = ["model=micro", "train=smoke"]


def _job_spans(sweeps: Path) -> dict[str, tuple[datetime, datetime]]:
    """Each local job's process, from its submitit log: job name -> (started, ended)."""
    spans = {}
    for log in sweeps.rglob(".submitit/*/*_0_log.out"):
        text = log.read_text()
        stamps = [datetime.strptime(m, "%Y-%m-%d %H:%M:%S,%f") for m in re.findall(r"submitit INFO \((.*?)\)", text)]
        [name] = set(re.findall(r"^\d\d:\d\d:\d\d (\S+) \[", text, re.M))
        spans[name] = (stamps[0], stamps[-1])
    return spans


@pytest.mark.slow
def test_jobs_of_one_gpu_each_run_two_at_a_time_on_two_gpus_never_sharing_one(ddl_home):
    out = run_cli("ddl-run", "-m", *SMOKE, "seed=0,1,2", "hydra.launcher.gpus_per_node=1", "experiment=pinned",
                  env_extra={"CUDA_VISIBLE_DEVICES": "3,5"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    gpus = {r.info.run_name: r.data.tags["ddl.cuda_visible_devices"] for r in mlflow_runs("pinned")}
    spans = _job_spans(ddl_home / "sweeps" / "pinned")
    assert set(gpus) == set(spans) and len(spans) == 3 and set(gpus.values()) == {"3", "5"}
    first, second, third = sorted(spans, key=lambda name: spans[name][0])
    assert spans[second][0] < spans[first][1], spans                          # two at once
    assert gpus[first] != gpus[second], gpus
    assert spans[third][0] >= min(spans[first][1], spans[second][1]), spans   # never three
    still = [name for name in (first, second) if spans[name][1] > spans[third][0]]
    assert all(gpus[name] != gpus[third] for name in still), (spans, gpus)


@pytest.mark.slow
def test_a_job_of_every_gpu_is_one_ddp_job_of_a_task_per_gpu(ddl_home):
    out = run_cli("ddl-run", "-m", *SMOKE, "train.batch_tokens=512", "hydra.launcher.gpus_per_node=2",
                  "experiment=all_gpus", env_extra={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [run] = mlflow_runs("all_gpus")
    assert run.data.tags["ddl.cuda_visible_devices"] == "0,1"
    assert_two_ranks_trained(ddl_home / "sweeps" / "all_gpus")


def test_more_gpus_a_job_than_the_machine_has_is_one_line_and_nothing_runs(ddl_home):
    out = run_cli("ddl-run", "-m", *SMOKE, "hydra.launcher.gpus_per_node=3", env_extra={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert out.returncode == 2 and out.stderr.strip() == (
        "ddl-run: error: hydra.launcher.gpus_per_node=3: this machine has 2 GPUs (CUDA_VISIBLE_DEVICES=0,1); ask at "
        "most 2, or 0 to train on CPU"), out.stderr
    assert not (ddl_home / "runs").exists() and mlflow_runs("default") == []
