"""Sizes as an axis: the token budget c * N, the sizes' parameter counts, the scaling sweep's plan, and the
report across sizes on runs logged to a real MLflow store (synthetic power laws, the paper's own numbers)."""

import csv
import math
import re

import pytest
import torch

from ddl.data import DataConfig
from ddl.model import GPT, model_config, param_count
from ddl.model.config import backbone_params, non_embedding_params
from ddl.train import RunConfig, TrainConfig
from tests.conftest import run_cli

CPU_SIZES = ("micro", "tiny", "mini")
ROWS = {"baseline": dict(residual="baseline"), "ddl_dv1": dict(residual="ddl", dv=1),
        "ddl_dv4": dict(residual="ddl", dv=4), "ddl_dv4_ec": dict(residual="ddl", dv=4, conv="ec"),
        "ddl_dv4_cc": dict(residual="ddl", dv=4, conv="cc")}


def run(size: str, row: str = "baseline", **train) -> RunConfig:
    data = DataConfig(source="python_source")
    return RunConfig(model_config(size, vocab_size=data.model_vocab_size(), **ROWS[row]), data, TrainConfig(**train))


def test_tokens_per_param_sets_the_steps_of_every_row_of_a_size_from_the_baselines_n():
    for size in CPU_SIZES:
        steps = {row: run(size, row, tokens_per_param=0.75).train.steps for row in ROWS}
        n = backbone_params(run(size).model)
        assert set(steps.values()) == {math.ceil(0.75 * n / 1024)}, (size, steps)
    assert run("micro", tokens_per_param=1e-9).train.steps == 1


def test_the_budget_enters_the_signature_only_through_the_steps_it_sets():
    budget = run("tiny", "ddl_dv4", tokens_per_param=0.75)
    same = run("tiny", "ddl_dv4", steps=budget.train.steps)
    assert "tokens_per_param" not in budget.effective_dict()["train"]
    assert budget.signature() == same.signature()
    assert run("tiny", "ddl_dv4").signature() != same.signature()         # 300 steps: another run
    assert RunConfig.from_dict(budget.to_dict()).signature() == budget.signature()   # a checkpoint's config


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "1"])
def test_a_bad_budget_is_one_line_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"^train\.tokens_per_param=.*: must be null \(train\.steps sets the budget\)"):
        TrainConfig(tokens_per_param=bad)


def test_ddl_run_refuses_a_bad_budget_with_exit_2_and_writes_nothing(ddl_home):
    out = run_cli("ddl-run", "train.tokens_per_param=-2", "--dry-run")
    assert out.returncode == 2 and not (ddl_home / "mlflow.db").exists() and not (ddl_home / "runs").exists()
    assert (out.stdout + out.stderr).strip().splitlines()[-1] == (
        "ddl-run: error: train.tokens_per_param=-2.0: must be null (train.steps sets the budget) or a finite number "
        "> 0 (tokens per non-embedding parameter)")


def test_warmup_frac_sets_the_warmup_from_the_steps_the_budget_set():
    """The same schedule shape at every horizon: the warmup is the share f of whatever steps the run has."""
    for size in CPU_SIZES:
        shaped = run(size, "ddl_dv4", tokens_per_param=0.75, warmup_frac=0.052)
        assert shaped.train.warmup_steps == round(0.052 * shaped.train.steps)
    tiny = run("tiny", tokens_per_param=0.75, warmup_frac=0.052)
    assert tiny.train.steps == 577 and tiny.train.warmup_steps == 30       # the tuned study's runs, unchanged
    assert tiny.signature() == run("tiny", tokens_per_param=0.75).signature()
    assert "warmup_frac" not in tiny.effective_dict()["train"]
    assert run("tiny", steps=100, warmup_frac=0.0).train.warmup_steps == 0
    assert RunConfig.from_dict(tiny.to_dict()).signature() == tiny.signature()   # a checkpoint's config


@pytest.mark.parametrize("bad", [1.5, 1, -0.1, float("nan"), True, "0.1"])
def test_a_bad_warmup_share_is_one_line_naming_the_key(bad):
    with pytest.raises(ValueError, match=r"^train\.warmup_frac=.*: must be null \(train\.warmup_steps sets the "
                                         r"warmup\) or a number in \[0, 1\)"):
        TrainConfig(warmup_frac=bad)


def test_sizes_between_and_beyond_the_papers():
    from ddl.report.scaling import PAPER_N
    n = {size: non_embedding_params(model_config(size)) for size in (*CPU_SIZES, "small", "medium", "large")}
    assert n["micro"] < n["tiny"] < n["mini"] < n["small"] < n["medium"] < n["large"]
    assert {size: n[size] for size in PAPER_N} == PAPER_N          # where the report puts the paper's points
    cfg = model_config("large")
    with torch.device("meta"):                                      # the shapes, without 3 GB of weights
        assert GPT(cfg).num_params() == param_count(cfg)
    assert abs(param_count(cfg) / 760e6 - 1) < 0.01                 # GPT-3's 760M shape


@pytest.mark.slow
def test_the_scaling_sweep_plans_3_sizes_x_4_rows_x_3_seeds_within_90_minutes(ddl_home):
    out = run_cli("ddl-run", "-m", "+sweep=scaling", "--dry-run", env_extra={"COLUMNS": "200"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "36 override sets -> 36 distinct jobs" in out.stdout
    for size in CPU_SIZES:
        for row in ("baseline", "ddl_dv1", "ddl_dv4", "ddl_dv4_ec"):
            assert all(f"{row}-{size}-s{seed} " in out.stdout for seed in range(3))
    wall = re.search(r"about ([\d.]+) min wall with 2 jobs at once", " ".join(out.stdout.split()))
    assert wall and float(wall.group(1)) <= 90, out.stdout[-600:]


# -- the report across sizes, on runs logged to a real MLflow store ---------------------------------------


def log_runs(experiment: str, runs: list[dict]) -> None:
    """Finished runs as a trained job logs them, for what the report reads: params (size, row, seed, parameter
    count, dims, data, schedule), the final validation loss, the signature tag."""
    from ddl.track import store
    client, experiment_id = store.client(), store.experiment_id(experiment)
    for i, r in enumerate(runs):
        cfg = model_config(r["size"], vocab_size=r.get("vocab", 256), **ROWS[r["row"]])
        params = {"model.size": r["size"], "model.row": r["row"], "seed": r["seed"],
                  "model.params": r.get("params", param_count(cfg)), "model.vocab_size": cfg.vocab_size,
                  "model.d_model": cfg.d_model, "model.n_layer": cfg.n_layer, "data.source": r.get("data", "synthetic"),
                  "train.steps": r.get("steps", 100), "train.batch_tokens": 1024}
        tags = {store.SIGNATURE_TAG: f"{experiment}-{i}", "ddl.loss_unit": "nats/token (byte)"}
        created = client.create_run(experiment_id, run_name=f"{r['row']}-{r['size']}-s{r['seed']}", tags=tags)
        from mlflow.entities import Metric, Param
        client.log_batch(created.info.run_id, metrics=[Metric("final/val/loss", r["loss"], 0, 0)],
                         params=[Param(k, str(v)) for k, v in params.items()])
        client.set_terminated(created.info.run_id, "FINISHED")


def report(home, experiment: str) -> tuple:
    from ddl.report.cli import main
    assert main(["--experiment", experiment, "--out", str(home / "reports")]) == 0
    folder = home / "reports" / experiment
    scaling = folder / "scaling.csv"
    return folder, list(csv.DictReader(scaling.open())) if scaling.exists() else None


ALPHA = {"baseline": 0.10, "ddl_dv4": 0.12}        # the true exponents of the synthetic losses
NOISE = {"baseline": (1.003, 0.998, 0.999), "ddl_dv4": (0.999, 1.002, 0.9985)}   # per seed, multiplicative


@pytest.fixture(scope="module")
def synthetic(module_ddl_home):
    """loss = 10 N^-alpha per row at the three CPU sizes, 3 seeds, each seed off the law by <= 0.3%."""
    runs = [dict(size=size, row=row, seed=seed, loss=10 * non_embedding_params(model_config(
                 size, vocab_size=256, **ROWS[row])) ** -alpha * NOISE[row][seed])
            for size in CPU_SIZES for row, alpha in ALPHA.items() for seed in range(3)]
    log_runs("synthetic", runs)
    return report(module_ddl_home, "synthetic")


@pytest.mark.slow
def test_the_fit_recovers_the_power_laws_exponent(synthetic):
    folder, rows = synthetic
    fits = {r["row"]: r for r in rows if r["kind"] == "fit"}
    for row, alpha in ALPHA.items():                 # tolerance 0.005: the noise moves the slope by ~0.001
        fit = fits[row]
        assert fit["form"] == "a·N^-alpha" and fit["points"] == "9"          # three sizes: the pure law
        assert float(fit["alpha"]) == pytest.approx(alpha, abs=0.005)
        assert float(fit["alpha_low"]) < alpha < float(fit["alpha_high"])
        assert float(fit["a"]) == pytest.approx(10, rel=0.05)
    points = [r for r in rows if r["kind"] == "point"]
    assert [p["size"] for p in points] == list(CPU_SIZES) and all(p["seeds"] == "3" for p in points)
    for p in points:                                 # the paired relative difference, with its interval
        assert float(p["ci_low_pct"]) < float(p["relative_pct"]) < float(p["ci_high_pct"]) < 0
        assert p["verdict"] == "better" and float(p["params_ratio"]) > 1 and float(p["flops_per_token"]) > 0
    gaps = {r["size"]: r for r in rows if r["kind"] == "extrapolated_gap"}
    for size, n in (("small", 84_956_928), ("medium", 301_997_056)):    # the true gap there: N^-0.02 - 1
        gap = gaps[size]
        assert gap["extrapolated"] == "True"
        assert float(gap["ci_low_pct"]) < 100 * (n ** -0.02 - 1) < float(gap["ci_high_pct"])
    page = (folder / "index.html").read_text()
    assert "Across sizes" in page and "EXTRAPOLATED" in page
    for name in ("scaling_gap.png", "scaling_gap.svg", "scaling_loss.png", "scaling.md"):
        assert (folder / name).stat().st_size > 1000 and name in page


@pytest.mark.slow
def test_the_papers_numbers_as_runs_come_back_as_its_points(module_ddl_home, synthetic):
    from ddl.report.scaling import PAPER_N
    from ddl.report.tables import paper_values
    paper = paper_values().query("table == 'table3' and metric == 'val_loss'")
    loss = {(r["size"], r["model"]): r["value"] for _, r in paper.iterrows()}
    log_runs("paper", [dict(size=size, row=row, seed=0, loss=value, vocab=50304, data="fineweb_edu")
                       for (size, row), value in loss.items()])
    folder, rows = report(module_ddl_home, "paper")
    ours = {(r["row"], r["size"]): r for r in rows if r["kind"] == "point"}
    theirs = {(r["row"], r["size"]): r for r in rows if r["kind"] == "paper"}
    assert set(ours) == set(theirs) == {(row, size) for size, row in loss if row != "baseline"}
    for (row, size), point in ours.items():          # one seed: the paper's relative difference, no interval
        expected = 100 * (loss[size, row] - loss[size, "baseline"]) / loss[size, "baseline"]
        assert float(point["relative_pct"]) == pytest.approx(expected, abs=1e-9)
        assert float(theirs[row, size]["relative_pct"]) == pytest.approx(expected, abs=1e-9)
        assert point["ci_low_pct"] == "" and point["seeds"] == "1"
        n = non_embedding_params(model_config(size, **ROWS[row]))    # ours: the row's N; the paper's: its size's
        assert int(point["n"]) == n and int(theirs[row, size]["n"]) == PAPER_N[size] < n < 1.01 * PAPER_N[size]
    gaps = {(r["row"], r["size"]): r for r in rows if r["kind"] == "extrapolated_gap"}
    for (row, size), gap in gaps.items():            # two sizes: the line through the paper's points, no interval
        assert float(gap["relative_pct"]) == pytest.approx(float(ours[row, size]["relative_pct"]), abs=1e-6)
        assert gap["ci_low_pct"] == "" and gap["extrapolated"] == "False"
    assert "| DDL (d_v=1) | small (paper) |" in (folder / "scaling.md").read_text()


@pytest.mark.slow
def test_one_size_writes_no_view_across_sizes(module_ddl_home, synthetic):
    log_runs("one_size", [dict(size="tiny", row=row, seed=seed, loss=2.0 + 0.01 * seed)
                          for row in ALPHA for seed in range(2)])
    folder, rows = report(module_ddl_home, "one_size")
    assert rows is None and (folder / "table3.md").exists()
    assert not list(folder.glob("scaling*")) and "Across sizes" not in (folder / "index.html").read_text()
    log_runs("baselines", [dict(size=size, row="baseline", seed=0, loss=3.0 - i) for i, size in enumerate(CPU_SIZES)])
    folder, rows = report(module_ddl_home, "baselines")        # no row to pair: the fit, no gap
    assert [r["kind"] for r in rows] == ["fit"] and not (folder / "scaling_gap.png").exists()
    assert (folder / "scaling_loss.png").exists()


@pytest.mark.slow
def test_the_tuned_scaling_sweep_refuses_its_horizons_and_with_an_exponent_carries_in_an_afternoon(ddl_home):
    out = run_cli("ddl-run", "-m", "+sweep=scaling_tuned", "--dry-run")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("ddl-run: error: tune.max_horizon_ratio=2: carrying train.lr from 74,752 to 590,848 "
                           "tokens a run (7.9x)"), line
    out = run_cli("ddl-run", "-m", "+sweep=scaling_tuned", "tune.horizon_exponent=0.5", "--dry-run",
                  env_extra={"COLUMNS": "200"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    assert text.count("carried from micro, train.lr x 0.356") == 4 and text.count("train.lr x 0.232") == 4
    assert "4 rows searched at micro, 8 carried from there" in text
    for size in ("tiny", "mini"):
        assert all(f"{row}-{size} " in out.stdout for row in ("baseline", "ddl_dv1", "ddl_dv4", "ddl_dv4_ec"))
    assert "each searched 3 times independently" in text and "at most 228 jobs" in text
    wall = re.search(r"about ([\d.]+) min wall on 2 slots", text)    # three replicates a row: 3x one search's cost
    assert wall and float(wall.group(1)) <= 300, out.stdout[-600:]
    assert not ddl_home.exists()
