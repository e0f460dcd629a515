"""A search carried across sizes: the dry run names the carried rows, the horizon rule moves or refuses a carried lr,
and the real carried study (searched at micro, confirmed at tiny, run twice) trains nothing twice and reports per size.
Its own module: its study is a module fixture, so it runs on a worker of its own beside test_tune.py's."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import pytest

from ddl.tune.horizon import carry_factors
from tests.conftest import mlflow_runs, run_cli

CARRIED = ["residual=ddl,baseline", "dv=4", "model=micro,tiny", "train.lr=tag(log, interval(3e-3, 3e-1))",
           "train=smoke", "train.steps=10", "tune.trials=2", "tune.seeds=1", "tune.replicates=2",
           "tune.bracket_trials=2", "tune.search_size=micro", "experiment=carried"]


def test_a_dry_run_shows_which_rows_are_searched_and_which_carried(ddl_home):
    out = run_cli("ddl-run", "-m", *CARRIED, "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    assert out.stdout.count("carried from micro") == 2 and "2 rows searched at micro, 2 carried from there" in text
    assert "at most 24 jobs" in text   # micro: 2 rows x 2 replicates x (2 trials + 2 bracket + 1 seed); tiny: 1 seed
    assert not ddl_home.exists()


def config(steps: int, batch_tokens: int = 1024):
    return SimpleNamespace(train=SimpleNamespace(steps=steps, batch_tokens=batch_tokens))


def test_the_horizon_rule_moves_a_carried_lr_or_refuses_a_carry_too_far():
    assert carry_factors(config(100), config(400), ["train.lr"], 0.5, None) == {"train.lr": pytest.approx(0.5)}
    assert carry_factors(config(100), config(100, 4096), ["train.lr"], 1.0, 2.0) == {"train.lr": pytest.approx(0.25)}
    assert carry_factors(config(100), config(400), ["train.wd"], None, 2.0) == {}       # only the lr moves
    assert carry_factors(config(100), config(200), ["train.lr"], None, 2.0) == {}       # within the ratio: as it is
    with pytest.raises(ValueError, match=r"^tune\.max_horizon_ratio=2: carrying train\.lr from 102,400 to 409,600 "
                                         r"tokens a run \(4x\)"):
        carry_factors(config(100), config(400), ["train.lr"], None, 2.0)
    with pytest.raises(ValueError, match=r"\(0\.25x\)"):
        carry_factors(config(400), config(100), ["train.lr"], None, 2.0)


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    """A search at micro carried to tiny, then the same command again, in a home of its own (the stopped
    search below waits for the first checkpoint in its module's home)."""
    home = tmp_path_factory.mktemp("carried")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDL_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        # ~20 jobs, each mostly its process's start-up: 6 minutes on a quiet 2-core machine, over 8 beside a hog
        return run_cli("ddl-run", "-m", *CARRIED, timeout=2400), run_cli("ddl-run", "-m", *CARRIED, timeout=600), home


@pytest.mark.slow
def test_a_search_at_one_size_carries_its_best_to_the_others_and_trains_nothing_twice(carried, monkeypatch):
    first, again, home = carried
    assert first.returncode == 0, first.stderr[-3000:]
    monkeypatch.setenv("DDL_HOME", str(home))
    runs = mlflow_runs("carried")
    trials = [r for r in runs if r.data.tags.get("ddl.role") == "trial"]
    assert 8 <= len(trials) <= 16 and {r.data.params["model.size"] for r in trials} == {"micro"}   # and brackets
    parents = {r.data.tags["ddl.search"]: r for r in runs if r.data.tags.get("ddl.role") == "search"}
    carriers = [p for p in parents.values() if p.data.tags.get("ddl.carried_from") == "micro"]
    assert len(parents) == 8 and len(carriers) == 4
    for parent in carriers:        # replicate r: the micro row's replicate r's best at its fresh seeds, children of it
        source = parents[parent.data.tags["ddl.source_search"]]
        best = json.loads(source.data.tags["ddl.best_values"])
        own = [r for r in runs if r.data.tags.get("ddl.search") == parent.data.tags["ddl.search"] and r is not parent]
        first = 1000 * int(parent.data.tags["ddl.replicate"]) + 1
        assert source.data.tags["ddl.replicate"] == parent.data.tags["ddl.replicate"]
        assert [r.data.params["seed"] for r in own] == [str(first)]
        assert {r.data.params["model.size"] for r in own} == {"tiny"}
        assert {r.data.params["model.row"] for r in own} == {source.data.tags["ddl.row"].split("-")[0]}
        assert all(float(r.data.params["train.lr"]) == best["train.lr"] and r.data.tags["ddl.role"] == "confirm"
                   and r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in own)
    confirmed = [r for r in runs if r.data.tags.get("ddl.role") == "confirm" and r.data.params["model.size"] == "micro"]
    assert sorted(r.data.params["seed"] for r in confirmed) == sorted(["1", "1001"] * 2)
    assert again.returncode == 0 and "search round" not in again.stdout, again.stdout[-3000:]
    assert "0 finished, 8 skipped" in again.stdout and len(mlflow_runs("carried")) == len(runs)


@pytest.mark.slow
def test_the_report_reads_a_carried_study_per_size_and_across_sizes(carried, tmp_path):
    out = run_cli("ddl-report", "--experiment", "carried", "--out", str(tmp_path),
                  env_extra={"DDL_HOME": str(carried[-1])})
    assert out.returncode == 0, out.stderr[-2000:]
    report = tmp_path / "carried"
    tuned = (report / "tuned.md").read_text()
    assert "| Model | Tiny valid loss at its optimum | Micro valid loss at its optimum |" in tuned
    assert "| DDL (d_v=4) | " in tuned
    assert "DDL (d_v=4) at tiny: carried from micro train.lr=" in tuned and "at micro: best train.lr=" in tuned
    with open(report / "scaling.csv") as f:          # each row at its own best, paired with its tuned baseline
        points = [r for r in csv.DictReader(f) if r["kind"] == "point"]
    assert [(p["row"], p["size"], p["seeds"]) for p in points] == [("ddl_dv4", "micro", "2"), ("ddl_dv4", "tiny", "2")]
    assert "carried to the other sizes" in (report / "scaling.md").read_text()
    assert (report / "sensitivity_micro.png").exists() and not (report / "sensitivity_tiny.png").exists()
