"""make report on a real MLflow store written by real ddl-run sweeps (not hand-made dataframes)."""

import csv

import pytest

from tests.conftest import mlflow_runs, run_cli

MICRO = ["model=micro", "train=smoke", "experiment=report"]


@pytest.fixture(scope="module")
def report(module_ddl_home):
    home = module_ddl_home
    for arms in (["residual=ddl,baseline", "dv=1,4"], ["residual=ddl,baseline", "dv=4", "seed=1"]):  # d_v=1: one seed
        sweep = run_cli("ddl-run", "-m", *arms, *MICRO, "eval=offline", "eval.limit=20")
        assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    failing = run_cli("ddl-run", "dv=4", "conv=cc", *MICRO, "model.init=gpt2", "model.init_std=1e15")
    assert failing.returncode != 0
    small = run_cli("ddl-run", "residual=baseline", "model=small", "train=smoke", "experiment=report",
                    "train.steps=1", "train.seq_len=32", "train.micro_batch=2", "train.batch_tokens=64",
                    "train.eval_tokens=64", "train.warmup_steps=0", "train.checkpoint_artifact=none")
    assert small.returncode == 0, small.stderr[-2000:]
    out = run_cli("ddl-report", "--experiment", "report", "--out", str(home / "reports"))
    assert out.returncode == 0, out.stderr[-2000:]
    return home / "reports" / "report", mlflow_runs("report"), out.stdout


def cells(path):
    with open(path) as f:
        return {(r["row"], r["column"]): r for r in csv.DictReader(f)}


@pytest.mark.slow
def test_table3_cells_are_the_runs_final_metrics_paired_by_seed(report):
    out_dir, runs, _ = report
    table = cells(out_dir / "table3.csv")
    finished = [r for r in runs if r.info.status == "FINISHED" and r.data.params["model.size"] == "micro"]
    assert len(finished) == 5
    loss = {(r.data.params["model.row"], r.data.params["seed"]): r.data.metrics["final/val/loss"] for r in finished}
    for row in ("baseline", "ddl_dv4"):
        cell = table[row, "micro/val_loss"]
        assert cell["n_seeds"] == "2" and float(cell["mean"]) == pytest.approx((loss[row, "0"] + loss[row, "1"]) / 2)
    cell = table["ddl_dv4", "micro/val_loss"]
    differences = [loss["ddl_dv4", seed] - loss["baseline", seed] for seed in "01"]
    assert float(cell["vs_baseline"]) == pytest.approx(sum(differences) / 2) and cell["paired_seeds"] == "2"
    low, high = float(cell["ci_low"]), float(cell["ci_high"])
    assert low < float(cell["vs_baseline"]) < high
    assert cell["verdict"] == ("better" if high < 0 else "worse" if low > 0 else "not resolved")
    assert float(cell["paper_relative_pct_small"]) == pytest.approx(100 * (2.83545 - 2.85426) / 2.85426)
    one_seed = table["ddl_dv1", "micro/val_loss"]                  # one seed: a difference, no interval, no bold
    assert one_seed["n_seeds"] == "1" and one_seed["ci_low"] == "" and one_seed["verdict"] == "not resolved"
    assert one_seed["rank"] == "" and float(one_seed["vs_baseline"]) == pytest.approx(
        loss["ddl_dv1", "0"] - loss["baseline", "0"])
    assert table["ddl_dv4_cc", "micro/val_loss"]["marker"] == "FAILED"
    assert table["ddl_dv4_ec", "micro/val_loss"]["marker"] == "—"
    md = (out_dir / "table3.md").read_text()
    assert "FAILED" in next(line for line in md.splitlines() if line.startswith("| DDL-CC |"))
    assert "#### Micro valid loss against the baseline, paired by seed" in md and "| paper Δ % (small) |" in md


@pytest.mark.slow
def test_no_paper_value_beside_a_run_on_other_data(report):
    """The small baseline trained on the embedded bytes: the paper's 2.8543 (GPT-2 tokens) is not its peer."""
    out_dir, runs, _ = report
    cell = cells(out_dir / "table3.csv")["baseline", "small/val_loss"]
    assert cell["paper"] == "" and cell["mean"] != ""
    md = (out_dir / "table3.md").read_text()
    assert "paper 2.8543" not in md and "FineWeb-Edu" not in md
    assert r"\toprule" in (out_dir / "table3.tex").read_text()


@pytest.mark.slow
def test_offline_task_columns_figures_and_html(report):
    out_dir, runs, stdout = report
    acc = cells(out_dir / "accuracy_micro_0shot.csv")
    ddl_runs = [r for r in runs if r.data.params.get("model.row") == "ddl_dv4" and r.info.status == "FINISHED"]
    assert len(ddl_runs) == 2 and float(acc["ddl_dv4", "ddl_continuation"]["mean"]) == pytest.approx(
        100 * sum(r.data.metrics["eval/0shot/ddl_continuation/reported"] for r in ddl_runs) / 2)
    assert acc["ddl_dv4", "ddl_continuation"]["items"] == "20"
    assert float(acc["ddl_dv4", "ddl_continuation"]["stderr"]) > 0
    assert "20 items)" in (out_dir / "accuracy_micro_0shot.md").read_text()
    for name in ("figure2_micro.png", "figure2_micro.svg", "figure2_small.png", "index.html"):
        assert (out_dir / name).stat().st_size > 1000
    page = (out_dir / "index.html").read_text()
    assert "Table 3" in page and "figure2_micro.png" in page and "nats/token (byte)" in page
    across = (out_dir / "scaling.csv").read_text()       # runs of micro and small: the view across sizes
    assert "scaling_gap.png" in page and "point,ddl_dv4,micro," in across and "fit,baseline," in across
    assert "report:" in stdout and "Micro Valid Loss" in stdout and "paired by seed" in stdout


@pytest.mark.slow
def test_runs_that_differ_in_a_setting_are_rows_not_seeds(report):
    out_dir, _, _ = report
    sweep = run_cli("ddl-run", "-m", "beta_init=0.5,1.5", "model=micro", "train=smoke", "experiment=variants")
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    out = run_cli("ddl-report", "--experiment", "variants", "--out", str(out_dir.parent))
    assert out.returncode == 0, out.stderr[-2000:]
    table = cells(out_dir.parent / "variants" / "table3.csv")
    runs = {r.data.params["model.beta_init"]: r for r in mlflow_runs("variants")}
    for beta, run in runs.items():
        cell = table[f"ddl_dv1 model.beta_init={beta}", "micro/val_loss"]
        assert cell["n_seeds"] == "1" and float(cell["mean"]) == pytest.approx(run.data.metrics["final/val/loss"])
    assert len(runs) == 2 and ("ddl_dv1", "micro/val_loss") not in table
    assert "| DDL (d_v=1) model.beta_init=0.5 |" in (out_dir.parent / "variants" / "table3.md").read_text()


def test_runs_of_older_code_defaults_are_never_averaged_with_todays():
    """A run logged before a setting existed (no model.init param: before reference parity) is a row
    of its own, not a seed of today's row; seeds of one setting still share a row."""
    import pandas as pd
    from ddl.report.tables import variant_rows
    runs = pd.DataFrame({"params.model.row": ["ddl_dv4"] * 3, "params.model.size": ["tiny"] * 3,
                         "params.seed": ["0", "1", "0"], "params.model.dv": ["4"] * 3,
                         "params.model.init": ["reference", "reference", None]})
    rows = variant_rows(runs)
    assert rows[0] == rows[1] == "ddl_dv4 model.init=reference"
    assert rows[2] == "ddl_dv4 model.init=(not logged)"


def test_a_row_of_a_search_pairs_with_its_tuned_baseline_and_other_rows_pair_as_before():
    """Each row at its own learning rate (a carried size): the rows of a search pair ignoring the searched key;
    plain runs at those rates do not pair; a search's trials still pair only at a rate both tried."""
    import json

    import pandas as pd
    from ddl.report.tables import baseline_rows

    def frame(rows: dict[str, float], searched: bool) -> pd.DataFrame:
        return pd.DataFrame({"row": list(rows), "params.data.source": "python_source",
                             "params.train.lr": [str(lr) for lr in rows.values()],
                             "tags.ddl.trial_values": [json.dumps({"train.lr": lr}) if searched else None
                                                       for lr in rows.values()]})
    at_own_best = {"ddl_dv4": 4e-3, "baseline": 1e-3}
    assert baseline_rows(frame(at_own_best, searched=True)) == {"ddl_dv4": "baseline"}
    assert baseline_rows(frame(at_own_best, searched=False)) == {}
    trials = {"ddl_dv4 train.lr=0.001": 1e-3, "ddl_dv4 train.lr=0.004": 4e-3, "ddl_dv1 train.lr=0.002": 2e-3,
              "baseline train.lr=0.001": 1e-3, "baseline train.lr=0.004": 4e-3}
    assert baseline_rows(frame(trials, searched=True)) == {"ddl_dv4 train.lr=0.001": "baseline train.lr=0.001",
                                                           "ddl_dv4 train.lr=0.004": "baseline train.lr=0.004"}
