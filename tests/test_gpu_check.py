"""`make gpu-check` (ddl/gpu_check.py): its parts run here on the CPU, at the micro size, as they will on a GPU."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from ddl import gpu_check
from tests.conftest import python_module


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: gpu-check would run")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    done = subprocess.run([*python_module("ddl.gpu_check"), "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("gpu-check: no CUDA GPU"), done.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argument, value, message", [
    ("--parts", "step,bogus", "--parts: 'bogus' unknown; allowed: train, step, resume, tests, profile, kernels"),
    ("--arms", "baseline,ddl_dv9", "--arms: 'ddl_dv9' unknown; allowed: baseline, ddl_dv1, "),
    ("--arms", "baseline,,ddl_dv1", "--arms: '' unknown; allowed: baseline, ddl_dv1, "),
    ("--arms", "baseline,ddl_dv1\nrm", "--arms: 'ddl_dv1\\nrm' unknown; allowed: "),
    ("--arms", "ddl_dv1,baseline", "--arms: 'ddl_dv1,baseline' starts with 'ddl_dv1'; allowed: baseline first"),
    ("--size", "nan", "argument --size: invalid choice: 'nan' (choose from 'micro', 'tiny', "),
    ("--out", "a\nb", "argument --out: 'a\\nb': must be a non-empty path of printable characters")])
def test_an_unknown_part_arm_size_or_a_control_character_is_refused_in_one_line(tmp_path, argument, value, message):
    done = subprocess.run([*python_module("ddl.gpu_check"), "--device", "cpu", "--out", str(tmp_path / "out"),
                           argument, value], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    [error] = done.stderr.strip().splitlines()                                        # the error line alone
    assert message in error
    assert not any(tmp_path.iterdir())


CURVE = [(step, 5.0 - step / 100) for step in range(10, 201, 10)]


def test_a_resumed_curve_is_judged_continuous_finite_and_close():
    relogged = CURVE[:13] + [(step, loss + 0.01) for step, loss in CURVE[10:]]   # killed at 130, resumed from 100
    judged = gpu_check.compare_curves(CURVE, relogged, killed_at=130, seconds=1.0)
    assert judged["ok"] and judged["continuous"] and judged["resumed_from"] == 100
    assert judged["largest_loss_difference"] == pytest.approx(0.01)
    gap = CURVE[:10] + CURVE[11:]                                                # step 110 never logged
    assert not gpu_check.compare_curves(CURVE, gap, 130, 1.0)["continuous"]
    nan = CURVE[:-1] + [(200, math.nan)]
    assert not gpu_check.compare_curves(CURVE, nan, 130, 1.0)["ok"]
    drifted = CURVE[:-1] + [(200, CURVE[-1][1] + 0.2)]
    assert not gpu_check.compare_curves(CURVE, drifted, 130, 1.0)["ok"]


def test_the_targets_are_judged_from_the_step_rows():
    row = {"step_ms": 40.0, "host_ms": 39.5, "time_ratio": 1.0, "tokens_per_s": 4e5, "memory_mib": 1.0,
           "memory_ratio": 1.0, "params": 1, "mfu": 0.41, "first_step_s": 9.0, "gradient_error": 0.01}
    rows = {"baseline": row, "ddl_dv1": {**row, "time_ratio": 1.04}, "ddl_dv4": {**row, "time_ratio": 1.12,
                                                                               "gradient_error": 0.9}}
    judged = gpu_check.targets(rows)
    assert {name: t["met"] for name, t in judged.items()} == {
        "ddl_dv1 step / baseline": True, "ddl_dv4 step / baseline": False, "baseline MFU": True,
        "baseline compiled gradients": True, "ddl_dv1 compiled gradients": True, "ddl_dv4 compiled gradients": False}
    text = gpu_check.markdown({"machine": {"device": "GPU", "torch": "t", "triton": "3"}, "parts": ["step"],
                               "step": {"rows": rows, "targets": judged}})
    assert "| ddl_dv4 step / baseline | 1.12 | <= 1.10 | MISSED |" in text
    assert "| baseline | 40.0 | 39.5 | 1.000 |" in text                           # step, host launches, ratio
    assert "| baseline MFU | 41.0% | >= 40% | met |" in text


def test_a_training_runs_targets_are_judged_and_a_failed_run_is_shown():
    rows = {"baseline": {"tokens_per_s": 1e6, "intervals": 10, "params": 1, "mfu": 0.36, "peak_gib": 20.0,
                         "time_ratio": 1.0},
            "ddl_dv1": {"tokens_per_s": 9.6e5, "intervals": 10, "params": 1, "mfu": 0.35, "peak_gib": 21.0,
                        "time_ratio": 1.0417},
            "ddl_dv4": {"error": "the run exited 1 (train-ddl_dv4.log)"}}
    judged = gpu_check.train_targets(rows)
    assert {name: t["met"] for name, t in judged.items()} == {"ddl_dv1 step / baseline": True, "baseline MFU": True}
    text = gpu_check.markdown({"machine": {"device": "GPU", "torch": "t", "triton": "3", "size": "small"},
                               "parts": ["train"], "train": {"compile_mode": "reduce-overhead", "rows": rows,
                                                             "targets": judged}})
    assert "## Training runs: small, compiled per block, CUDA graphs, 60 steps each" in text
    assert "| ddl_dv1 | 960,000 | 1.042 | 35.0% | 21.0 |" in text
    assert "| ddl_dv4 | the run exited 1 (train-ddl_dv4.log) | | | |" in text
    assert "| baseline MFU | 36.0% | >= 35% | met |" in text


@pytest.mark.slow
def test_its_parts_run_on_the_cpu_and_write_their_figures(tmp_path):
    """The train part (a training run per arm), the step part (compiled per block in the mode that takes CUDA graphs
    on a GPU, the gradients checked against eager) and the resume part (a run killed with SIGKILL and resumed) at the
    micro size on the CPU: the same code a GPU runs at small. The blocks are compiled by aot_eager: dynamo's graphs,
    forward and backward, without inductor's C++ for the CPU (~40 kernels, ~35 s of g++ on a cold cache), which a GPU
    never runs; inductor's numbers on the fused ops are test_model_bf16_compile's."""
    out = tmp_path / "out"
    done = subprocess.run([*python_module("ddl.gpu_check"), "--device", "cpu", "--parts", "train,step,resume",
                           "--compile-mode", "reduce-overhead", "--compile-backend", "aot_eager", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    train = summary["train"]                                                      # a training run per arm, eager here
    assert list(train["rows"]) == ["baseline", "ddl_dv1", "ddl_dv4"] and train["compile_mode"] == "eager"
    assert all(row["tokens_per_s"] > 0 and row["intervals"] >= 5 for row in train["rows"].values()), train
    assert train["rows"]["baseline"]["time_ratio"] == 1.0 and train["rows"]["ddl_dv4"]["time_ratio"] > 0
    step = summary["step"]
    rows = step["rows"]
    assert list(rows) == ["baseline", "ddl_dv1", "ddl_dv4"]
    assert (step["compile_mode"], step["compile_backend"]) == ("reduce-overhead", "aot_eager")
    assert all(row["gradient_error"] < 1e-4 for row in rows.values()), rows      # fp32 on the CPU
    assert all(0 < row["host_ms"] <= row["step_ms"] * 1.001 for row in rows.values()), rows   # the CPU: all host
    resume = summary["resume"]
    assert resume["ok"] and resume["continuous"] and resume["finite"], resume
    assert resume["killed_after_step"] >= gpu_check.RESUME_KILL_AFTER
    assert resume["largest_loss_difference"] < 1e-3                               # fp32: the same numbers
    assert "## Step: micro, bf16 on CUDA, compiled per block, CUDA graphs (reduce-overhead), by aot_eager" in (
        out / "summary.md").read_text()
    assert done.returncode == 1, done.stdout                                      # no MFU on a CPU: MISSED


@pytest.mark.slow
def test_its_kernels_part_times_every_delta_op(tmp_path):
    """The kernels part on the CPU, its Triton kernels under the interpreter: every op runs and is measured; the plain
    norm it compares with compiled by aot_eager (inductor's C++ for the CPU is test_model_bf16_compile's)."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "ddl.gpu_check", "--device", "cpu", "--parts", "kernels",
                           "--compile-backend", "aot_eager", "--out", str(out)], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    ops = json.loads((out / "summary.json").read_text())["kernels"]["ops"]
    assert len(ops) == 9 and all(row["us"] > 0 and row["bytes"] > 0 for row in ops.values()), ops
    triton_loops = pytest.importorskip("ddl.model.fused.triton_loops", reason="triton is not installed")
    tiles = {f"{warps}x{features}" for warps, features in gpu_check.launch_settings(True, on_gpu=False)}
    # the interpreter: every tile size at the chosen warps
    assert tiles == {f"{triton_loops.TILE_WARPS}x{f}" for f in gpu_check.KERNEL_TILE_FEATURES}
    assert {name: set(row["us_by_launch"]) for name, row in ops.items()} == {
        name: {"chosen"} | (tiles if name in triton_loops.TILED_OPS else set()) for name in ops}
    summary = (out / "summary.md").read_text()
    assert "| write_backward |" in summary and "us as plain ops compiled by aot_eager." in summary
    assert f"; rank_one_forward {triton_loops.TILE_WARPS}x64: " in summary


def test_on_a_gpu_the_kernels_part_times_each_op_at_each_warps_and_a_tiled_op_at_each_tile_size():
    pytest.importorskip("ddl.model.fused.triton_loops", reason="triton is not installed")
    settings = gpu_check.launch_settings(True, on_gpu=True)
    assert settings == [(w, f) for w in gpu_check.KERNEL_WARPS for f in gpu_check.KERNEL_TILE_FEATURES]
    assert gpu_check.launch_settings(False, on_gpu=True) == [(w, None) for w in gpu_check.KERNEL_WARPS]
    assert gpu_check.launch_settings(False, on_gpu=False) == []
