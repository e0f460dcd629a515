"""`make gpu-check` (ddl/gpu_check.py): what runs here without a GPU, and what it will run with one."""

import subprocess
import sys

import pytest
import torch

from ddl import gpu_check
from tests.conftest import run_cli


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: gpu-check would run")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ddl.gpu_check", "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("gpu-check: no CUDA GPU"), done.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("arm", gpu_check.RUN_ARMS)
def test_its_training_runs_are_valid_ddl_run_commands(arm, ddl_home):
    """The runs it would launch, planned (--dry-run): their overrides name real keys and values."""
    command = gpu_check.run_command(arm, steps=50)
    done = run_cli("ddl-run", *command[1:], "--dry-run", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{arm}-small-s0" in done.stdout


def test_it_judges_the_targets_from_the_bench_report():
    row = {"step_ms": 100.0, "time_ratio": 1.0, "tokens_per_s": 1.6e5, "memory_mib": 1.0, "memory_ratio": 1.0,
           "params": 1, "mfu": 0.45}
    bench = {"model_small_bf16_compiled": {"baseline": row, "ddl_dv4": {**row, "time_ratio": 1.12, "mfu": 0.41}}}
    judged = gpu_check.targets(bench)
    assert [t["met"] for t in judged.values()] == [False, True, True]
    summary = {"machine": {"device": "GPU", "torch": "t", "triton": "3"}, "steps": 50,
               "tests": {"exit_code": 0, "summary": "60 passed"},
               "runs": {arm: {"exit_code": 0, "seconds": 60.0, "final": {"train/loss": 3.0, "val/loss": 3.1},
                              "tokens_per_s": 1e5} for arm in gpu_check.RUN_ARMS},
               "bench": {"exit_code": 0, "seconds": 600.0, "targets": judged}}
    text = gpu_check.markdown(summary)
    assert "| ddl_dv4 step / baseline | 1.120 | <= 1.10 | MISSED |" in text
    assert "| ddl_dv4 MFU | 41.0% | >= 40% | met |" in text
