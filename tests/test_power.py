"""What a plan can resolve (ddl.launch.power): the detectable gap in every compared sweep's plan, `detect=` sizing
the seeds (or a search's replicates and seeds), its refusals, and the report of a store logged by hand."""

import math

import pytest

from ddl.launch.power import LUCK
from ddl.stats import detectable, units_to_detect
from tests.conftest import run_cli
from tests.test_hostile import assert_nothing_created, assert_one_line

SMOKE = ["model=micro", "train=smoke"]


def test_the_detectable_gap_is_resolved_with_80_percent_power():
    """At the gap detectable() gives, a paired t test over n seeds resolves with chance 0.8 (scipy.stats' noncentral
    t), and units_to_detect is the first n whose gap fits."""
    from scipy.stats import nct, t
    for n, alpha in ((3, 0.05), (4, 0.01), (10, 0.05), (30, 0.01)):
        gap = detectable(1.0, n, alpha)
        q = t.ppf(1 - alpha / 2, n - 1)
        lower = nct.cdf(-q, n - 1, gap * math.sqrt(n))            # ~0, where scipy.stats may give nan
        power = nct.sf(q, n - 1, gap * math.sqrt(n)) + (0.0 if math.isnan(lower) else lower)
        assert abs(power - 0.8) < 1e-6, (n, power)
    assert detectable(1.0, 1) is None
    n = units_to_detect(1.0, 0.5)
    assert detectable(1.0, n) <= 0.5 < detectable(1.0, n - 1)
    assert units_to_detect(1.0, 0.5, limit=n - 1) is None


def test_paper_small_says_one_seed_resolves_nothing_and_detect_sizes_its_seeds_and_gpu_hours(ddl_home):
    out = run_cli("ddl-run", "-m", "+sweep=paper_small", "hydra/launcher=slurm", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the store holds no two seeds of a row there and no seed_sd= was given; a pilot that tells: 3 baseline " \
           "seeds at small" in out.stdout
    assert out.stdout.count("1 seed paired: no paired interval, resolves no gap") == 5
    sized = run_cli("ddl-run", "-m", "+sweep=paper_small", "hydra/launcher=slurm", "--dry-run", "seed_sd=0.01",
                    "detect=0.0066")
    assert sized.returncode == 0, sized.stderr[-2000:]
    text = " ".join(sized.stdout.split())
    n = units_to_detect(0.01 * math.sqrt(2), 0.0066 * 2.85426)        # the paper's baseline loss at small
    assert f"detect=0.0066 sizes each compared row at {n} seeds" in text
    assert f"ddl_dv4-small: {n} seeds paired: resolves |gap| >= " in text
    assert "the paper's gap at small: -0.66%" in text
    assert f"{6 * n} jobs, {6 * n} to run" in text and "GPU-h" in text
    assert_nothing_created(ddl_home)


def test_the_tuned_study_states_each_rows_detectable_gap_or_its_pilot(ddl_home):
    out = run_cli("ddl-run", "-m", "+sweep=tuned", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "a pilot that tells: 3 baseline seeds at tiny on python_source/byte" in out.stdout
    given = run_cli("ddl-run", "-m", "+sweep=tuned", "--dry-run", "seed_sd=0.015")
    lines = [line for line in given.stdout.splitlines() if "replicates x 3 seeds" in line]
    gap = detectable(0.015 * math.sqrt(2) * math.sqrt(1 / 3 + LUCK), 3)     # a replicate: 3 seeds and the luck
    assert [line.split(":")[0].strip() for line in lines] == ["ddl_dv1-tiny", "ddl_dv4-tiny", "ddl_dv4_ec-tiny"]
    assert all(f"resolves |gap| >= {gap:.3g} nats with the search's luck as simulated" in line for line in lines)


def test_detect_sizes_a_searched_rows_replicates_and_seeds_cheapest_in_runs(ddl_home):
    """A search of the paper's small rows with a goal: the replicates and seeds that reach it for the fewest runs,
    each replicate costing its trials and bracket trials besides its seeds; the plan is re-made with them."""
    from ddl.launch.power import Design, Spread
    out = run_cli("ddl-run", "-m", "+sweep=paper_small", "hydra/launcher=slurm", "+variant=baseline,ddl_dv4",
                  "train.lr=tag(log, interval(3e-4, 3e-3))", "seed_sd=0.01", "detect=0.0066", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    spread, target = Spread(0.01 * math.sqrt(2), "", 2.85426), 0.0066 * 2.85426
    fits = [Design(r, s, 0.05, True) for r in range(2, 101) for s in range(1, 10)
            if Design(r, s, 0.05, True).gap(spread) <= target]
    best = min(fits, key=lambda d: (d.units * (8 + 2 + d.seeds), d.units))
    assert f"sizes each row at tune.replicates={best.units} tune.seeds={best.seeds}" in out.stdout
    assert f"ddl_dv4-small: {best.units} replicates x {best.seeds} seeds: resolves |gap| >= " in out.stdout
    assert "| baseline-small | " in out.stdout.replace("┃", "|").replace("│", "|")


def log_runs(experiment: str, rows: dict, params: dict) -> None:
    """Finished runs logged by hand: {(row, seed): final loss}, each with `params` and its row's."""
    from ddl.track import store
    c = store.client()
    exp = store.experiment_id(experiment)
    for (row, seed), loss in rows.items():
        run = c.create_run(exp, tags={"ddl.signature": f"{row}-{seed}", "ddl.sweep": experiment})
        residual = {} if "model.residual" not in params else \
            {"model.residual": "baseline" if row == "baseline" else "ddl"}
        for key, value in {**params, **residual, "model.row": row, "seed": seed}.items():
            c.log_param(run.info.run_id, key, value)
        c.log_metric(run.info.run_id, "final/val/loss", loss)
        c.set_terminated(run.info.run_id, "FINISHED")


def test_the_stores_paired_seeds_give_the_spread_and_detect_sizes_from_it(ddl_home):
    smoke = {"model.size": "micro", "data.source": "embedded", "data.tokenizer": "byte", "train.steps": 20,
             "train.batch_tokens": 256, "model.residual": ""}
    shift = {0: 0.0, 1: 0.02, 2: -0.01, 3: 0.03}
    log_runs("pilot", {**{("baseline", s): 3.9 + d for s, d in shift.items()},
                       **{("ddl_dv1", s): 3.88 + d + 0.004 * (-1) ** s for s, d in shift.items()}}, smoke)
    out = run_cli("ddl-run", "-m", *SMOKE, "residual=ddl,baseline", "seed=0,1", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    sd = math.sqrt(sum((0.004 * (-1) ** s - 0.0) ** 2 for s in shift) / 3)   # the differences' sd (mean 0)
    assert "from the store: 4 paired differences between rows at micro on embedded/byte, 20 steps" in out.stdout
    assert f"ddl_dv1-micro: 2 seeds paired: resolves |gap| >= {detectable(sd, 2):.3g} nats" in out.stdout
    sized = run_cli("ddl-run", "-m", *SMOKE, "residual=ddl,baseline", "--dry-run", "detect=0.002")
    n = units_to_detect(sd, 0.002 * sum(3.9 + d for d in shift.values()) / 4)
    assert f"sizes each compared row at {n} seeds" in sized.stdout, sized.stdout[-2000:]
    assert f"{2 * n} jobs, {2 * n} to run" in " ".join(sized.stdout.split())


@pytest.mark.parametrize("args, message", [
    (["detect=0"], "detect=0.0: must be a share of the baseline's loss in (0, 1)"),
    (["detect=nan"], "detect=nan: must be a share of the baseline's loss in (0, 1)"),
    (["seed_sd=-1"], "seed_sd=-1.0: must be a number of nats > 0"),
    (["residual=baseline", "detect=0.01"], "detect=0.01: the sweep has no row beside a baseline"),
    (["residual=ddl,baseline", "seed_sd=0.01", "detect=0.0001"], "detect=0.0001: sizing a row's seeds needs the "
                                                                   "baseline's loss"),
])
def test_a_bad_goal_is_one_line_exit_2_and_nothing_created(ddl_home, args, message):
    out = run_cli("ddl-run", "-m", *SMOKE, *args)
    assert_one_line(out, "ddl-run: error: ", message)
    assert_nothing_created(ddl_home)


def test_a_goal_beyond_max_seeds_names_what_would_reach_it(ddl_home):
    out = run_cli("ddl-run", "-m", "+sweep=paper_small", "hydra/launcher=slurm", "seed_sd=0.01", "detect=0.001")
    n = units_to_detect(0.01 * math.sqrt(2), 0.001 * 2.85426)
    assert_one_line(out, "ddl-run: error: ", f"needs {n} seeds a row at a paired sd of 0.0141 nats, over "
                                             f"tune.max_seeds=9: set tune.max_seeds={n}, or detect >= ")
    assert_nothing_created(ddl_home)


def test_a_store_of_the_papers_numbers_logged_by_hand_reports(ddl_home):
    """Table 3 as finished runs with only model.size, model.row and seed: the report pairs them, says one seed
    resolves no gap beside the paper's, and has no equal-compute value for runs with no parameter count; --docs
    writes its tables for docs/."""
    from ddl.report.tables import paper_values
    paper = paper_values()
    losses = paper[(paper["table"] == "table3") & (paper["metric"] == "val_loss")]
    for size, rows in losses.groupby("size"):
        log_runs("paper", {(row, 0): float(v) for row, v in zip(rows["model"], rows["value"], strict=True)},
                 {"model.size": size})
    docs = ddl_home.parent / "docs"
    out = run_cli("ddl-report", "--experiment", "paper", "--out", str(ddl_home.parent / "reports"), "--docs", str(docs))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr and "Small valid loss against the baseline" in out.stdout
    table = (ddl_home.parent / "reports" / "paper" / "table3.md").read_text()
    blocked = ddl_home.parent / "a_file"
    blocked.write_text("")
    refused = run_cli("ddl-report", "--experiment", "paper", "--out", str(ddl_home.parent / "other"), "--docs",
                      str(blocked / "docs"))                 # a --docs that cannot be made: before any report
    assert refused.returncode == 2 and refused.stdout.strip().startswith("ddl-report: error: ")
    assert len(refused.stdout.strip().splitlines()) == 1 and not (ddl_home.parent / "other").exists()
    page = (docs / "paper.md").read_text()                   # --docs: the same tables, for docs/results/
    assert page.startswith(f"# paper\n\nWritten by `ddl-report --experiment paper --docs {docs}` from the store")
    assert table.split("\n", 1)[1] in page
    assert "| DDL (d_v=4) | 1 | -0.0188 | -0.66% | not resolved (one seed: resolves no gap; the paper's gap at small " \
           "is -0.66%) | no paired value |  | a run logged no parameter count (params.model.params) |" in table
