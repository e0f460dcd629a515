"""What the plan tells about a GPU cluster before anything runs: each arm's GPU-hours from its counted memory traffic,
its memory per GPU, and a one-line refusal of a job the cluster could not start."""

import pytest
import torch

from ddl import costs, traffic
from ddl.model import SIZES, ModelConfig, model_config, param_count
from tests.conftest import run_cli


def small(**arm) -> ModelConfig:
    return model_config("small", **arm)


def test_the_dry_run_prices_a_delta_arm_above_the_baseline_and_d_v_4_above_d_v_1():
    tokens = 4.92e10
    hours = {name: costs.gpu_hours(cfg, param_count(cfg), tokens)
             for name, cfg in {"baseline": small(), "dv1": small(residual="ddl"), "dv4": small(residual="ddl", dv=4)}
             .items()}
    assert hours["dv4"] > hours["baseline"] and hours["dv4"] > hours["dv1"]
    memory = {dv: costs.memory_per_gpu(small(residual="ddl", dv=dv), param_count(small()), 24 * 1024) for dv in (1, 4)}
    assert memory[4] > memory[1] > 16 * param_count(small())
    checkpointed = costs.memory_per_gpu(small(residual="ddl", dv=4), param_count(small()), 24 * 1024, True)
    assert checkpointed < memory[4] / 2


def test_memory_under_cuda_graphs_takes_the_ratio_training_runs_with_graphs_measured(tmp_path, monkeypatch):
    """Until gpu-check's train part records the peak over saved activations under graphs, a job under graphs is
    priced as without and the plan says so; once it has, that ratio."""
    model, n, tokens = small(residual="ddl", dv=4), param_count(small()), 24 * 1024
    assert "graphs_peak_over_saved" not in costs.recorded()["gpu"]
    assert costs.memory_per_gpu(model, n, tokens, graphs=True) == costs.memory_per_gpu(model, n, tokens)
    plan = run_cli("ddl-run", "-m", "+sweep=paper_small", "hydra/launcher=slurm", "train.compile=true",
                   "train.compile_mode=reduce-overhead", "--dry-run")
    assert plan.returncode == 0 and "the graphs' memory pool is not measured yet" in plan.stdout, plan.stderr[-2000:]
    figures = tmp_path / "recorded_costs.json"
    figures.write_text(costs.RECORDED_COSTS.read_text())
    costs.record("gpu", {"graphs_peak_over_saved": 2 * costs.recorded()["gpu"]["peak_over_saved"]}, figures)
    monkeypatch.setattr(costs, "RECORDED_COSTS", figures)
    costs.recorded.cache_clear()
    try:
        saved = costs.memory_per_gpu(model, n, tokens) - 16 * n
        assert costs.memory_per_gpu(model, n, tokens, graphs=True) - 16 * n == pytest.approx(2 * saved)
    finally:
        monkeypatch.undo()
        costs.recorded.cache_clear()


def test_every_variant_the_sweeps_name_is_priced_from_its_own_counted_traffic():
    arms = costs.traffic_table()["arms"]
    for name, arm in traffic.TABLE_ARMS.items():
        assert costs.arm_key(small(**arm)) in arms, name
    assert costs.traffic(small(residual="ddl", dv=5))[0] == costs.arm_key(small(residual="ddl", dv=4))   # nearest


def test_the_table_is_the_counter_s():
    """traffic_table.json holds what ddl.traffic counts now (python -m ddl.traffic rewrites it): d_v=4's coefficients
    from a fresh count, within 1%."""
    shape = {**SIZES[traffic.TABLE_SIZE], "vocab_size": ModelConfig.vocab_size}
    base, dv4 = (traffic.step_traffic(ModelConfig(**shape, **arm)) for arm in ({}, dict(residual="ddl", dv=4)))
    per = 16 * 1024 * shape["n_layer"] * shape["d_model"]
    entry = costs.traffic_table()["arms"][costs.arm_key(ModelConfig(**shape, residual="ddl", dv=4))]
    assert entry["extra_bytes"] == pytest.approx((dv4["non_matmul_bytes"] - base["non_matmul_bytes"]) / per, rel=0.01)
    assert entry["extra_saved"] == pytest.approx((dv4["saved_bytes"] - base["saved_bytes"]) / per, rel=0.01)
    assert torch.__version__  # the counter ran on this torch


def refused(*args: str) -> str:
    """ddl-run's one-line refusal of a dry run, exit 2, nothing written."""
    out = run_cli("ddl-run", "-m", *args, "--dry-run")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("ddl-run: error: "), (out.stdout, out.stderr)
    return lines[0]


def test_a_world_size_that_does_not_divide_the_batch_is_refused_naming_micro_batches_that_do(ddl_home):
    line = refused("+sweep=paper_small", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=8")
    assert line == ("ddl-run: error: train.micro_batch=24: 491,520 tokens a step do not split over 8 ranks x "
                    "micro_batch x 1024; micro-batches that divide: 20, 15, 12, 10, 6, 5, 4, 3, 2, 1  "
                    "[job baseline-small-s0]")
    assert not any(ddl_home.iterdir()) if ddl_home.exists() else True


def test_a_job_too_big_for_its_gpus_is_refused_naming_what_fits(ddl_home):
    line = refused("+sweep=paper_small", "hydra/launcher=slurm", "train.micro_batch=96", "train.batch_tokens=393216")
    assert "train.micro_batch=96: job baseline-small-s0 needs ~" in line
    assert "GiB per GPU (hydra.launcher.gpu_memory_gib=80): micro-batches that fit: 48, 32, 24, or " \
           "train.activation_checkpointing=true" in line
    fits = run_cli("ddl-run", "-m", "+sweep=paper_small", "hydra/launcher=slurm", "train.micro_batch=96",
                   "train.batch_tokens=393216", "train.activation_checkpointing=true", "--dry-run")
    assert fits.returncode == 0, fits.stderr[-2000:]


def test_a_gpu_memory_that_is_not_a_positive_number_is_refused(ddl_home):
    assert refused("+sweep=paper_small", "hydra/launcher=slurm", "hydra.launcher.gpu_memory_gib=-5") == \
        "ddl-run: error: hydra.launcher.gpu_memory_gib=-5: must be a number of GiB > 0"


@pytest.mark.parametrize("override, message", [
    ("ddl.state_dtype=fp8", "state_dtype='fp8': must be one of auto, fp32, bf16"),
    ("model.state_dtype=bf16", "model.state_dtype: unknown key; did you mean ddl.state_dtype?"),   # a Delta knob
    ("train.activation_checkpointing=maybe", "train.activation_checkpointing"),
])
def test_bad_values_of_the_new_keys_are_one_line(override, message, ddl_home):
    out = run_cli("ddl-run", "model=micro", "residual=ddl", override)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and message in lines[0], out.stderr
    assert not (ddl_home / "mlflow.db").exists() and not (ddl_home / "runs").exists()
