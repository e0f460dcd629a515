"""A sweep's per-row search: the space in Hydra's grammar, refusals, the sequential rule by simulation, and
the real search end to end (Hydra, the local submitit launcher, the MLflow store): stopped and re-launched
it trains no trial twice, a pruned trial is marked and not a failure, and the report shows what tuning changed."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
from types import SimpleNamespace

import pytest

from ddl.tune.horizon import carry_factors
from tests.conftest import VENV_BIN, logged_steps, mlflow_runs, run_cli

SEARCH = ["residual=ddl,baseline", "dv=4", "train.lr=tag(log, interval(3e-4, 3e-2))", "model=micro", "train=smoke",
          "train.steps=20", "tune.trials=3", "tune.seeds=2", "experiment=tuned"]


def _split(*overrides):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ddl.tune.space import split
    return split(OverridesParser.create().parse_overrides(list(overrides)))


def test_the_grammar_splits_rows_from_the_searched_space():
    rows, space = _split("residual=ddl,baseline", "seed=range(0,2)", "model=micro",
                         "train.lr=tag(log, interval(3e-4, 3e-2))", "conv=choice(none, ec)", "n=int(interval(1, 8))")
    assert [o.get_key_element() for o in rows] == ["residual", "seed", "model"]
    lr, conv, n = space
    assert (lr.key, lr.low, lr.high, lr.log, lr.integer) == ("train.lr", 3e-4, 3e-2, True, False)
    assert conv.choices == ("none", "ec") and conv.categorical
    assert (n.low, n.high, n.integer, n.log) == (1, 8, True, False)
    assert lr.override(0.1 + 0.2) == "train.lr=0.30000000000000004"      # a float reads back to itself
    assert lr.ends() == ["train.lr=0.0003", "train.lr=0.03"]


@pytest.mark.parametrize("override, says", [
    ("train.lr=interval(3e-2, 3e-4)", "empty or reversed range"),
    ("train.lr=interval(1e-3, 1e-3)", "empty or reversed range"),
    ("train.lr=tag(log, interval(0, 1))", "log scale needs low > 0"),
    ("train.lr=tag(lg, interval(1e-4, 1))", "unknown tag lg"),
    ("conv=choice(ec)", "needs two values or more"),
])
def test_a_range_that_cannot_be_searched_is_refused(override, says):
    with pytest.raises(ValueError, match=says):
        _split(override)


def test_the_sequential_rule_keeps_its_error_rate_and_resolves_real_gaps():
    """Seeds added until the gap resolves (3, 5, 7, 9): over 2,000 A/A experiments it declares a difference in at
    most 5%; a true gap of 2 standard deviations of the paired difference resolves nearly always, mostly early.
    A rule that looked at the plain 95% interval at every look fails the first assertion (checked: 13%)."""
    from ddl.stats import paired
    from ddl.tune.config import TuneConfig
    from ddl.tune.sequential import look, look_levels, simulate
    plan = TuneConfig(seeds="auto", max_seeds=9).seed_plan
    assert plan == (3, 5, 7, 9) and sum(look_levels(plan, 0.05)) == pytest.approx(0.05)
    false_positives, _ = simulate(2000, 0.0, plan, 0.05)
    assert false_positives <= 0.05
    resolved, early = simulate(2000, 2.0, plan, 0.05)
    assert resolved >= 0.95 and early >= 0.5
    arm, base = {0: 2.0, 1: 2.1, 2: 1.95}, {0: 2.2, 1: 2.25, 2: 2.2}
    assert look(arm, base, (3,), 0.05).difference == paired(arm, base)   # one look: the plain 95% interval


@pytest.mark.parametrize("override, says", [
    ("train.lrr=interval(1e-4, 1e-2)", "train.lrr"),
    ("dv=interval(0.5, 4.5)", "dv="),
    ("train.lr=interval(-1e-3, 1e-3)", "train.lr=-0.001"),
    ("tune.trials=0", "tune.trials=0: must be an integer >= 1"),
    ("tune.search_size=tiny", "tune.search_size=tiny: must be null or one of the sweep's sizes: micro"),
    ("tune.max_horizon_ratio=0.5", "tune.max_horizon_ratio=0.5: must be null or a number >= 1"),
    ("tune.horizon_exponent=nan", "tune.horizon_exponent=nan: must be null or a finite number"),
])
def test_bad_search_input_is_one_line_and_creates_nothing(ddl_home, override, says):
    search = "train.lr=interval(1e-4, 1e-2)" if override.startswith("tune.") else override
    out = run_cli("ddl-run", "-m", "residual=ddl,baseline", search, *([override] if search != override else []),
                  "model=micro", "train=smoke")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("ddl-run: error: ") and says in line, line
    assert not (ddl_home / "mlflow.db").exists() and not (ddl_home / "runs").exists()


def test_a_dry_run_of_a_search_prints_its_plan_and_launches_nothing(ddl_home):
    out = run_cli("ddl-run", "-m", *SEARCH[:-3], "tune.trials=8", "tune.seeds=auto", "tune.max_seeds=7", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "planned search (dry run, nothing launched)" in out.stdout
    assert out.stdout.count("tag(log, interval(0.0003, 0.03))") == 2 and "auto: 3, 5, 7" in out.stdout
    assert "at most 28 jobs" in out.stdout and "core-min" in out.stdout      # 2 rows x (8 trials + 6 seeds)
    assert not ddl_home.exists()


CARRIED = ["residual=ddl,baseline", "dv=4", "model=micro,tiny", "train.lr=tag(log, interval(3e-4, 3e-2))",
           "train=smoke", "train.steps=10", "tune.trials=2", "tune.seeds=2", "tune.search_size=micro",
           "experiment=carried"]


def test_a_dry_run_shows_which_rows_are_searched_and_which_carried(ddl_home):
    out = run_cli("ddl-run", "-m", *CARRIED, "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    assert out.stdout.count("carried from micro") == 2 and "2 rows searched at micro, 2 carried from there" in text
    assert "at most 10 jobs" in text         # micro: 2 rows x (2 trials + 1 seed); tiny: 2 rows x 2 seeds
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
        return run_cli("ddl-run", "-m", *CARRIED), run_cli("ddl-run", "-m", *CARRIED), home


@pytest.mark.slow
def test_a_search_at_one_size_carries_its_best_to_the_others_and_trains_nothing_twice(carried, monkeypatch):
    first, again, home = carried
    assert first.returncode == 0, first.stderr[-3000:]
    monkeypatch.setenv("DDL_HOME", str(home))
    runs = mlflow_runs("carried")
    trials = [r for r in runs if r.data.tags.get("ddl.role") == "trial"]
    assert len(trials) == 4 and {r.data.params["model.size"] for r in trials} == {"micro"}
    parents = {r.data.tags["ddl.search"]: r for r in runs if r.data.tags.get("ddl.role") == "search"}
    carriers = [p for p in parents.values() if p.data.tags.get("ddl.carried_from") == "micro"]
    assert len(parents) == 4 and len(carriers) == 2
    for parent in carriers:                  # its runs: the micro row's best at seeds 0 and 1, children of it
        source = parents[parent.data.tags["ddl.source_search"]]
        best = json.loads(source.data.tags["ddl.best_values"])
        own = [r for r in runs if r.data.tags.get("ddl.search") == parent.data.tags["ddl.search"] and r is not parent]
        assert sorted(r.data.params["seed"] for r in own) == ["0", "1"]
        assert {r.data.params["model.size"] for r in own} == {"tiny"}
        assert {r.data.params["model.row"] for r in own} == {source.data.tags["ddl.row"].split("-")[0]}
        assert all(float(r.data.params["train.lr"]) == best["train.lr"] and r.data.tags["ddl.role"] == "confirm"
                   and r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in own)
    confirmed = [r for r in runs if r.data.tags.get("ddl.role") == "confirm" and r.data.params["model.size"] == "micro"]
    assert sorted(r.data.params["seed"] for r in confirmed) == ["1", "1"]
    assert again.returncode == 0 and "search round" not in again.stdout, again.stdout[-3000:]
    assert "0 finished, 6 skipped" in again.stdout and len(mlflow_runs("carried")) == len(runs)


@pytest.mark.slow
def test_the_report_reads_a_carried_study_per_size_and_across_sizes(carried, tmp_path):
    out = run_cli("ddl-report", "--experiment", "carried", "--out", str(tmp_path),
                  env_extra={"DDL_HOME": str(carried[-1])})
    assert out.returncode == 0, out.stderr[-2000:]
    report = tmp_path / "carried"
    tuned = (report / "tuned.md").read_text()
    assert "| Model | Tiny valid loss | Micro valid loss |" in tuned and "| DDL (d_v=4) | " in tuned
    assert "DDL (d_v=4) at tiny: carried from micro train.lr=" in tuned and "at micro: best train.lr=" in tuned
    with open(report / "scaling.csv") as f:          # each row at its own best, paired with its tuned baseline
        points = [r for r in csv.DictReader(f) if r["kind"] == "point"]
    assert [(p["row"], p["size"], p["seeds"]) for p in points] == [("ddl_dv4", "micro", "2"), ("ddl_dv4", "tiny", "2")]
    assert "carried to the other sizes" in (report / "scaling.md").read_text()
    assert (report / "sensitivity_micro.png").exists() and not (report / "sensitivity_tiny.png").exists()


def _trials(experiment: str) -> list:
    return [r for r in mlflow_runs(experiment) if r.data.tags.get("ddl.role") == "trial"]


@pytest.fixture(scope="module")
def searched(module_ddl_home):
    """The issue's search, stopped by SIGTERM while a trial trains, then run again to its end, then again."""
    import time
    sweep = subprocess.Popen([str(VENV_BIN / "ddl-run"), "-m", *SEARCH], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             start_new_session=True)
    deadline = time.monotonic() + 600
    while not list(module_ddl_home.glob("runs/*/checkpoints/step_00000010.pt")):
        assert time.monotonic() < deadline and sweep.poll() is None, "no trial reached its checkpoint"
        time.sleep(0.2)
    os.killpg(sweep.pid, signal.SIGTERM)
    _, stopped = sweep.communicate(timeout=600)
    interrupted = _trials("tuned")
    again = run_cli("ddl-run", "-m", *SEARCH)
    third = run_cli("ddl-run", "-m", *SEARCH)
    return sweep.returncode, stopped, interrupted, again, third, module_ddl_home


@pytest.mark.slow
def test_a_search_stopped_and_run_again_trains_no_trial_twice(searched):
    code, stopped, interrupted, again, third, _ = searched
    assert code == 128 + signal.SIGTERM and "its jobs resume when it is run again" in stopped, stopped[-2000:]
    assert "KILLED" in {r.info.status for r in interrupted}
    assert again.returncode == 0, again.stderr[-3000:]
    trials = _trials("tuned")
    by_search: dict[str, list] = {}
    for run in trials:
        by_search.setdefault(run.data.tags["ddl.search"], []).append(run)
    assert len(by_search) == 2
    for runs in by_search.values():                   # three trials a row, each once, distinct lrs in range
        assert sorted(int(r.data.tags["ddl.trial"]) for r in runs) == [0, 1, 2]
        lrs = [float(r.data.params["train.lr"]) for r in runs]
        assert len(set(lrs)) == 3 and all(3e-4 <= lr <= 3e-2 for lr in lrs)
        assert {r.data.tags["mlflow.parentRunId"] for r in runs} != {""}
        for run in runs:                              # each step trained and logged once, resumed or not
            train_steps, _ = logged_steps(run)
            last = int(run.data.tags["ddl.pruned"].split(":")[0].removeprefix("step ")) if "ddl.pruned" in \
                run.data.tags else 20                     # a pruned trial ends at its pruning step
            assert train_steps == sorted(set(train_steps)) and train_steps[-1] == last, train_steps
    assert {r.info.run_id for r in interrupted} <= {r.info.run_id for r in trials}   # resumed, not retrained
    confirmed = [r for r in mlflow_runs("tuned") if r.data.tags.get("ddl.role") == "confirm"]
    assert sorted(r.data.params["seed"] for r in confirmed) == ["1", "1"]
    assert "ddl-run: tuned rows" in again.stdout
    assert third.returncode == 0 and "0 finished, 2 skipped" in third.stdout, third.stdout
    assert "search round" not in third.stdout
    assert len(mlflow_runs("tuned")) == len(trials) + len(confirmed) + 2      # and the two parent runs


@pytest.mark.slow
def test_the_report_shows_what_tuning_changed(searched, tmp_path):
    home = searched[-1]
    out = run_cli("ddl-report", "--experiment", "tuned", "--out", str(tmp_path), env_extra={"DDL_HOME": str(home)})
    assert out.returncode == 0, out.stderr[-2000:]
    report = tmp_path / "tuned"
    assert (report / "sensitivity_micro.png").stat().st_size > 10_000
    tuned = (report / "tuned.md").read_text()
    assert "Each row at its own best" in tuned and "best train.lr=" in tuned and "the verdict" in tuned
    assert "at each row's best against the baseline, paired by seed" in tuned
    assert "a gap at a shared learning rate" in (report / "table3.md").read_text()


@pytest.mark.slow
def test_a_pruned_trial_is_marked_kept_and_not_a_failure(ddl_home):
    """Trials one at a time over a grid whose seeded order (sampler_seed=5) runs the two good learning rates
    first: the third, 1e-5, is far above their median at step 10 and is pruned there."""
    out = run_cli("ddl-run", "-m", "residual=baseline", "train.lr=choice(3e-3, 2e-3, 2e-5, 1e-5)", "model=micro",
                  "train=smoke", "train.eval_every=5", "tune.trials=3", "tune.parallel=1", "tune.seeds=1",
                  "tune.sampler_seed=5", "experiment=pruned")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "1 pruned, 0 failed or stopped" in out.stdout, out.stdout[-3000:]
    [pruned] = [r for r in _trials("pruned") if "ddl.pruned" in r.data.tags]
    assert pruned.info.status == "KILLED" and json.loads(pruned.data.tags["ddl.trial_values"]) == {"train.lr": 1e-5}
    assert pruned.data.tags["ddl.pruned"].startswith("step 10: pruned")
    run_dir = ddl_home / "runs" / pruned.data.tags["ddl.signature"]
    assert json.loads((run_dir / "status.json").read_text())["state"] == "pruned"
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*.pt")] == ["step_00000010.pt"]   # resumable


@pytest.mark.slow
def test_two_homes_on_the_team_server_continue_one_search(team_server, tmp_path):
    """Home a runs two trials of a search; home b, sharing only the server, asks for three: it finds a's parent
    run and trials there and trains the third alone."""
    from mlflow.tracking import MlflowClient
    search = ["-m", "residual=baseline", "train.lr=tag(log, interval(1e-3, 1e-2))", "model=micro", "train=smoke",
              "tune.seeds=1", "experiment=team-search"]
    env = {"MLFLOW_TRACKING_URI": team_server.uri}
    first = run_cli("ddl-run", *search, "tune.trials=2", env_extra={**env, "DDL_HOME": str(tmp_path / "a")})
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli("ddl-run", *search, "tune.trials=3", env_extra={**env, "DDL_HOME": str(tmp_path / "b")})
    assert second.returncode == 0 and "search round: 1 trial\n" in second.stdout, second.stdout[-3000:]
    client = MlflowClient(team_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("team-search").experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("ddl.role") == "search"]
    trials = sorted((r for r in runs if r.data.tags.get("ddl.role") == "trial"), key=lambda r: r.data.tags["ddl.trial"])
    assert [r.data.tags["ddl.trial"] for r in trials] == ["0", "1", "2"]
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {parent.info.run_id}
    homes = [r.data.tags["ddl.home"] for r in trials]
    assert homes[0] == homes[1] == str(tmp_path / "a") and homes[2] == str(tmp_path / "b")


@pytest.mark.slow
def test_sync_brings_a_search_back_with_its_parent(searched, tmp_path):
    """The home's journals into an empty store: every run of the search is there, each child under its parent."""
    from mlflow.tracking import MlflowClient
    uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    out = run_cli("ddl-track", "sync", "--to", uri, env_extra={"DDL_HOME": str(searched[-1])})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("tuned").experiment_id])
    parents = {r.info.run_id for r in runs if r.data.tags.get("ddl.role") == "search"}
    children = [r for r in runs if r.data.tags.get("ddl.role") in ("trial", "confirm")]
    assert len(parents) == 2 and len(children) == 8
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == parents


def test_each_round_asks_values_no_trial_has():
    """The study is rebuilt from the store every round: a seed fixed for every round drew the values of an
    earlier round again (the same signature: a pruned trial resumed as a 'new' one). The seed moves on with
    the history, and a value already tried is never asked."""
    from ddl.track.searches import Trial
    from ddl.tune.config import TuneConfig
    from ddl.tune.search import ask
    _, space = _split("train.lr=tag(log, interval(5e-4, 1.6e-2))")
    cfg, trials = TuneConfig(trials=12), []
    for round_ in range(5):
        asked = ask(trials, space, cfg, 2)
        assert len(asked) == 2 and not [v for v in asked if v in [t.values for t in trials]], round_
        assert ask(trials, space, cfg, 2) == asked                  # the same history asks the same trials
        for values in asked:
            state = "pruned" if values["train.lr"] > 1e-2 else "complete"
            trials.append(Trial("r", len(trials), "trial", values, 0, state, abs(values["train.lr"] - 3e-3),
                                {300: 2.0}))
    assert len({t.values["train.lr"] for t in trials}) == 10


def test_a_key_searched_twice_is_named_once():
    with pytest.raises(ValueError, match=r"^'train.lr=choice\(0.1, 1\)': train.lr searched twice"):
        _split("train.lr=interval(1e-4, 1e-2)", "train.lr=choice(0.1, 1)")
