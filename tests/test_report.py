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


@pytest.mark.slow
def test_each_comparison_is_answered_at_equal_tokens_and_at_equal_compute(report, tmp_path):
    """The loss table's comparisons gain the verdict at equal compute (training FLOPs by default): the baseline
    stopped early, the DDL row read off its curve at the baseline's total. A measure with no figure for a row (the
    H100's step times for CC) is one line, exit 2, nothing written."""
    out_dir, _, _ = report
    md = (out_dir / "table3.md").read_text()
    assert "Δ at equal tokens [95% CI]" in md and "Δ % at equal compute (training FLOPs) [95% CI]" in md
    dv4 = next(line for line in md.splitlines() if line.startswith("| DDL (d_v=4) | 2 |"))
    assert "cost ratio 1.0" in dv4 and "the baseline stopped early" in dv4 and "of its curve" in dv4
    out = run_cli("ddl-report", "--experiment", "report", "--compute", "h100", "--out", str(tmp_path / "gpu"))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout[-2000:] + out.stderr[-2000:]
    [line] = out.stdout.strip().splitlines()
    assert line.startswith("ddl-report: error: --compute=h100: no H100 step time") and "ddl_dv4_cc" in line
    assert not (tmp_path / "gpu").exists()


def _runs(row: str, dv: int, steps: int, losses: dict, params: int = 1000):
    import pandas as pd
    return pd.DataFrame([{"run_id": f"{row}-{steps}-{seed}", "status": "FINISHED", "params.seed": seed,
                          "metrics.final/val/loss": loss, "params.train.steps": str(steps), "params.model.row": row,
                          "params.model.params": str(params), "params.model.residual": "baseline" if dv == 0 else "ddl",
                          "params.model.dv": str(max(dv, 1)), "params.model.n_layer": "2", "params.model.d_model": "8"}
                         for seed, loss in losses.items()])


def test_at_equal_compute_the_costlier_row_is_read_where_its_cost_reaches_the_cheaper_ones_total():
    """d_v=4 at the CPU's 1.087: read at step 100 / 1.087 of its curve, linear between its validations; with the
    baseline trained 109 steps (100 x 1.087) it is compared there, measured."""
    import pandas as pd

    from ddl.report.compute import at_equal_compute
    row, base = _runs("ddl_dv4", 4, 100, {"0": 2.0, "1": 2.1}), _runs("baseline", 0, 100, {"0": 2.2, "1": 2.4})
    histories = pd.DataFrame([(f"ddl_dv4-100-{seed}", "val/loss", step, value) for seed, points in
                              {"0": {50: 3.0, 100: 2.0}, "1": {50: 3.1, 100: 2.1}}.items()
                              for step, value in points.items()], columns=["run_id", "key", "step", "value"])
    found = at_equal_compute(row, base, histories, "cpu")
    at = 100 / 1.087
    read = {seed: v50 + (v100 - v50) * (at - 50) / 50 for seed, v50, v100 in (("0", 3.0, 2.0), ("1", 3.1, 2.1))}
    assert found.ratio == pytest.approx(1.087) and f"step {at:.0f} of 100" in found.how
    assert found.difference.mean == pytest.approx((read["0"] - 2.2 + read["1"] - 2.4) / 2)
    longer = _runs("baseline", 0, 109, {"0": 2.15, "1": 2.3})
    measured = at_equal_compute(row, base, histories, "cpu", longer=longer)
    assert measured.how.startswith("measured: the baseline trained 109 steps")
    assert measured.difference.mean == pytest.approx((2.0 - 2.15 + 2.1 - 2.3) / 2)
    same = at_equal_compute(_runs("baseline", 0, 100, {"0": 2.1, "1": 2.2}), base, histories, "cpu")
    assert same.ratio == 1.0 and same.how == "one cost: as at equal tokens"   # a copy of the row: nothing stopped early
    assert same.difference.mean == pytest.approx((2.1 - 2.2 + 2.2 - 2.4) / 2)
    last_only = histories[histories["step"] == 100]                  # validated at its last step only
    unread = at_equal_compute(row, base, last_only, "cpu")
    assert unread.difference is None and "no validation loss on both sides of that step" in unread.how


def test_a_rows_cost_a_token_is_6n_and_the_delta_updates_own_or_a_recorded_step_time():
    from ddl.costs import cost_ratio, delta_flops_per_token
    from ddl.model import model_config, param_count
    base, dv4 = (model_config("tiny", vocab_size=256, residual=r, dv=4) for r in ("baseline", "ddl"))
    n, n_base = param_count(dv4), param_count(base)
    assert delta_flops_per_token(dv4) == 3 * 2 * 4 * (4 * 128 * 4 + 2 * 4 * 128 * 4) and not delta_flops_per_token(base)
    flops = (6 * n + delta_flops_per_token(dv4)) / (6 * n_base)
    assert cost_ratio(dv4, base, n, n_base, "flops") == pytest.approx(flops)
    assert cost_ratio(dv4, base, n, n_base, "cpu") == 1.087 and cost_ratio(dv4, base, n, n_base, "h100") == 1.633
    dv2 = model_config("tiny", vocab_size=256, residual="ddl", dv=2)
    assert cost_ratio(dv2, base, param_count(dv2), n_base, "cpu") is None      # no bench figure: UnknownCost


def test_copies_of_a_row_are_named_by_replica_in_the_tuned_table_and_compared_at_one_cost():
    """tuned_aa's table: six copies of the baseline (replica 0-5; 0, the default, is logged as no param), each searched
    once; copy 2k+1 against copy 2k. Each copy is labelled by its replica, in replica order, and its equal-compute
    verdict is its equal-tokens one."""
    import json

    import pandas as pd

    from ddl.report.tuning import tuned_table
    runs, searches = [], []
    for replica in range(6):
        search = f"s{replica}"
        searches.append({"tags.ddl.search": search, "tags.ddl.best_values": json.dumps({"train.lr": 0.01}),
                         "tags.ddl.replicate": "0" if replica != 4 else "zero",   # edited in the UI: no traceback
                         "tags.ddl.row_search": search,
                         "tags.ddl.baseline_search": f"s{replica - 1}" if replica % 2 else ""})
        for seed in ("1", "2", "3"):
            runs.append({"run_id": f"{search}-{seed}", "tags.ddl.search": search, "tags.ddl.role": "confirm",
                         "tags.ddl.trial_values": json.dumps({"train.lr": 0.01}), "params.model.row": "baseline",
                         "params.model.size": "micro", "params.replica": str(replica) if replica else None,
                         "params.seed": seed,
                         "params.model.residual": "baseline", "params.model.params": "1000", "params.model.dv": "1",
                         "params.model.n_layer": "2", "params.model.d_model": "8", "params.train.steps": "40",
                         "status": "FINISHED",
                         "metrics.final/val/loss": 3.6 + 0.01 * int(seed) + 0.001 * replica})
    runs.reverse()                                               # the table's order is the replicas', not the store's
    table = tuned_table(pd.DataFrame(runs), pd.DataFrame(searches), ["micro"], "nats", pd.DataFrame(
        columns=["run_id", "key", "step", "value"]), "flops")
    assert table.rows == ["baseline"] + [f"baseline replica={r}" for r in range(1, 6)]
    [(_, _, lines)] = table.sections
    compared = [line for line in lines if line[5] != "(the baseline)"]
    assert [line[0] for line in compared] == [f"Baseline replica={r}" for r in (1, 3, 5)]
    for line in compared:                                        # one replicate each: no interval, no verdict
        assert line[6] == line[4] and line[8].endswith("one cost: as at equal tokens"), line


def test_a_baseline_trained_longer_at_the_same_warmup_share_is_the_measured_equal_compute():
    """iso_compute's baseline at 627 steps warms up 33 (5.2% of its run) where the 577-step one warms up 30: the same
    setting but for its length, so it is where the costlier row is compared, measured. A warmup of another share is
    another setting."""
    import pandas as pd

    from ddl.report.tables import longer_runs
    def run(row, steps, warmup):
        return {"row": row, "params.train.steps": str(steps), "params.train.warmup_steps": str(warmup),
                "params.train.lr": "0.002", "params.data.name": "python_source"}
    runs = pd.DataFrame([run("baseline train.steps=577", 577, 30), run("baseline train.steps=627", 627, 33),
                         run("baseline train.steps=628 w", 628, 60), run("ddl_dv4", 577, 30)])
    assert list(longer_runs(runs, "baseline train.steps=577")["row"]) == ["baseline train.steps=627"]
    fixed = runs.assign(**{"params.train.warmup_steps": "30"})                      # a fixed warmup: the same steps
    assert len(longer_runs(fixed, "baseline train.steps=577")) == 2
