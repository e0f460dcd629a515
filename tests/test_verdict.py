"""One verdict path: the search's end and bracket, the confirmation's looks and the verdict are ddl.tune's, which the
driver, the simulator and the report call alike; a failed confirmation run counts; the report's interval is the
decision's, whatever the seeds."""

import math

import pytest

from ddl.tune.config import TuneConfig
from ddl.tune.sequential import FAILED, look
from ddl.tune.workflow import confirmed, next_round, verdict
from tests.conftest import mlflow_runs, run_cli
from tests.test_tune import _sim_trial, _split

BASE = {0: {1: 2.00, 2: 2.02, 3: 2.01}, 1: {1001: 2.03, 1002: 2.00, 1003: 2.02}, 2: {2001: 2.01, 2002: 2.04, 2003: 2.0}}


def _arm(shift: float) -> dict:
    return {r: {s: v - shift + 0.001 * (s % 7) for s, v in seeds.items()} for r, seeds in BASE.items()}


def test_a_row_whose_second_confirmation_seed_diverges_is_not_better():
    arm = _arm(0.2)
    assert verdict(look(arm, BASE, (3,), 0.05), True) == "better"
    arm[1][1002] = FAILED
    found = look(arm, BASE, (3,), 0.05)
    assert found.n == 3 and found.difference.n == 2                  # the seed counts; its replicate leaves
    said = verdict(found, True)
    assert said == "not resolved (the row's confirmation diverged or failed: replicate 1 seed 1002)"
    worse = _arm(-0.2)
    worse[1][1002] = FAILED                                          # a failure does not hide that it is worse
    assert verdict(look(worse, BASE, (3,), 0.05), True).startswith("worse (the row's confirmation diverged")
    base = {r: dict(seeds) for r, seeds in BASE.items()}
    base[0][2] = FAILED                                              # the baseline's failure blocks "worse"
    assert verdict(look(_arm(-0.2), base, (3,), 0.05), True).startswith("not resolved (the baseline's")


def test_a_confirmation_run_that_ended_without_a_loss_counts_as_failed():
    runs = [_sim_trial(0, 1e-3, "complete", 2.0), _sim_trial(0, 1e-3, "failed"), _sim_trial(0, 1e-3, "stopped"),
            _sim_trial(0, 1e-3, "running"), _sim_trial(0, 2e-3, "complete", 1.0)]
    for seed, run in enumerate(runs, start=1):
        run.role, run.seed = "confirm", seed
    assert confirmed(runs, {"train.lr": 1e-3}, {1, 2, 3, 4, 5}) == {1: 2.0, 2: math.inf, 3: math.inf}


def test_an_exhausted_integer_space_still_brackets_its_best():
    """Three integers searched with eight trials: once each is tried the sampler has nothing new, and the search goes
    on to its bracket (one integer beyond the best, past the range) rather than ending unbracketed."""
    _, space = _split("model.n_layer=int(interval(1, 3))")
    cfg = TuneConfig(trials=8, pruner="none")
    trials = [_sim_trial(i, 0, value=v) for i, v in enumerate((2.0, 1.9, 1.8))]
    for t, n in zip(trials, (1, 2, 3), strict=True):
        t.values = {"model.n_layer": n}
    step = next_round(trials, space, cfg, 0, 2)
    assert step.bracketing and step.new == [{"model.n_layer": 4}]


def test_an_integer_bracket_that_rounds_back_to_the_best_moves_one_integer():
    """On a log scale over 1..4 a fifth of the range is a factor 1.3: from 2 it rounds back to 2; the bracket trial
    goes one integer beyond instead."""
    from ddl.tune.bracket import open_edges
    _, space = _split("train.micro_batch=tag(log, int(interval(1, 4)))")
    trials = [_sim_trial(0, 0, value=1.0), _sim_trial(1, 0, value=2.0)]
    trials[0].values, trials[1].values = {"train.micro_batch": 2}, {"train.micro_batch": 1}
    [edge] = open_edges(trials, space)
    assert (edge.side, edge.values) == ("above", {"train.micro_batch": 3})


@pytest.mark.slow
def test_the_reports_interval_is_the_decisions_when_confirmation_seeds_cross_1000(ddl_home, tmp_path):
    """A search whose row seed is 998: its first replicate's confirmation seeds are 999 and 1000, its second's 1999
    and 2000 (seed // 1000, the report's old grouping, would have mixed them). The report's gap and interval are the
    ones the driver printed when it decided."""
    seed = 998
    out = run_cli("ddl-run", "-m", "residual=ddl,baseline", "model=micro", "train=smoke", f"seed={seed}",
                  "train.lr=choice(1e-2, 3e-2)", "tune.trials=2", "tune.replicates=2", "tune.seeds=2",
                  "tune.bracket_trials=0", "experiment=cross")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    decided = next(line for line in out.stdout.splitlines() if line.startswith("│ ddl_dv1-micro "))
    cells = [c.strip() for c in decided.split("│")]
    gap, said = cells[5], cells[6]
    assert gap.count("[") == 1, decided
    confirms = [r for r in mlflow_runs("cross") if r.data.tags.get("ddl.role") == "confirm"]
    assert sorted({int(r.data.params["seed"]) for r in confirms}) == sorted(
        seed + 1000 * r + k for r in range(2) for k in (1, 2))
    report = run_cli("ddl-report", "--experiment", "cross", "--out", str(tmp_path))
    assert report.returncode == 0, report.stdout[-3000:] + report.stderr[-3000:]
    tuned = (tmp_path / "cross" / "tuned.md").read_text()
    line = next(row for row in tuned.splitlines() if row.startswith("| DDL (d_v=1)") and "%" in row)
    assert f"| {gap} | {said} (could resolve >= " in line, (decided, line)     # beside the verdict: its power
