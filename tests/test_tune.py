"""A sweep's per-row search: the space in Hydra's grammar, refusals, the sequential rule by simulation, and
the real search end to end (Hydra, the local submitit launcher, the MLflow store): stopped and re-launched
it trains no trial twice, a pruned trial is marked and not a failure, and the report shows what tuning changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.conftest import ROOT, VENV_BIN, console_script, logged_steps, mlflow_runs, python_module, run_cli

SEARCH = ["residual=ddl,baseline", "dv=4", "train.lr=tag(log, interval(3e-4, 3e-2))", "model=micro", "train=smoke",
          "train.steps=20", "tune.trials=3", "tune.seeds=1", "tune.replicates=2", "experiment=tuned"]


def _split(*overrides):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ddl.tune.space import split
    return split(OverridesParser.create().parse_overrides(list(overrides)))


def test_the_grammar_splits_rows_from_the_searched_space():
    rows, space = _split("residual=ddl,baseline", "dv=range(1,3)", "model=micro",
                         "train.lr=tag(log, interval(3e-4, 3e-2))", "conv=choice(none, ec)", "n=int(interval(1, 8))")
    assert [o.get_key_element() for o in rows] == ["residual", "dv", "model"]
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


def test_the_sequential_rule_pairs_replicates_each_its_mean_over_fresh_seeds():
    """The unit is the search replicate: each one's mean over the looks' seeds, paired with the baseline's replicate of
    the same number; one look is the plain 95% interval over replicates, and the looks' levels add up to alpha."""
    from ddl.stats import paired
    from ddl.tune.config import TuneConfig
    from ddl.tune.sequential import look, look_levels
    plan = TuneConfig(seeds="auto", max_seeds=9).seed_plan
    assert plan == (3, 5, 7, 9) and sum(look_levels(plan, 0.05)) == pytest.approx(0.05)
    arm = {0: {1: 2.0, 2: 2.1, 3: 9.9}, 1: {1001: 1.9, 1002: 2.0}, 2: {2001: 2.05, 2002: 1.95}}
    base = {0: {1: 2.2, 2: 2.3}, 1: {1001: 2.1, 1002: 2.2}, 2: {2001: 2.2, 2002: 2.3}}
    found = look(arm, base, (2,), 0.05)          # replicate 0's third seed has no partner: left out
    assert found.n == 2 and found.final
    expected = paired({0: 2.05, 1: 1.95, 2: 2.0}, {0: 2.25, 1: 2.15, 2: 2.25})
    assert [getattr(found.difference, k) for k in ("n", "mean", "low", "high")] == pytest.approx(
        [getattr(expected, k) for k in ("n", "mean", "low", "high")])
    assert look(arm, base, (3, 5), 0.05).difference is None      # no look reached: every replicate needs 3


def test_the_workflow_a_a_test_holds_its_error_rate_small():
    """The suite's share of `python -m ddl.tune.simulate` (the whole grid, 1,000 experiments a cell, is the command's,
    docs/results.md): two identical rows searched by the project's own decisions (TPE, the pruner, the bracket, the
    confirmation over replicates) are declared different at most alpha + 3 Monte Carlo standard errors of the time;
    power grows with the gap, and the detectable gap lies between the gaps that resolve least and most."""
    from ddl.tune.config import TuneConfig
    from ddl.tune.simulate import GAPS, World, run_world
    cfg = TuneConfig(trials=6)
    for cell in run_world(World(0.08, "t3"), cfg, 24, seed=3):
        assert cell.false_positive <= cfg.alpha + 3 * cell.mcse, cell
        assert cell.bracketed >= 0.9 and cell.power[GAPS[-1]] >= 0.6 >= cell.power[GAPS[0]], cell
        assert GAPS[0] < cell.detectable <= cell.measured < 2 * GAPS[-1], cell


@pytest.mark.slow
def test_the_simulate_command_writes_its_table_between_the_markers(tmp_path):
    """The command prints the grid (curvatures 0-0.16, normal and t(3) noise, seeds 3 and auto), with a column per gap
    and the detectable gap, and writes it into the file between its markers, leaving the rest as it was; a file
    without them is one line, exit 2."""
    from ddl.tune.simulate import BEGIN, END
    results = tmp_path / "results.md"
    results.write_text(f"# before\n{BEGIN}\nold\n{END}\nafter\n")
    out = subprocess.run([*python_module("ddl.tune.simulate"), "--experiments", "3", "--jobs", "2",
                          "--write", str(results)], capture_output=True, text=True, timeout=600)
    assert out.returncode in (0, 1), out.stderr[-2000:]
    text = results.read_text()
    assert text.startswith(f"# before\n{BEGIN}\n| curvature") and text.endswith(f"{END}\nafter\n") and "old" not in text
    assert text.count("| Student-t(3) |") == 8 and text.count("| normal |") == 8 and "3 experiments" in text
    assert "| power at 0.25% | power at 0.5% | power at 0.66% (d_v=4) |" in text and "detectable gap" in text
    bare = tmp_path / "bare.md"
    bare.write_text("nothing\n")
    out = subprocess.run([*python_module("ddl.tune.simulate"), "--experiments", "1", "--write",
                          str(bare)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "markers" in out.stderr
    assert bare.read_text() == "nothing\n"


def _sim_trial(number: int, lr: float, state: str = "complete", value: float | None = None):
    from ddl.tune.simulate import SimTrial
    return SimTrial(number, {"train.lr": lr}, state, value)


def test_a_best_with_no_finished_trial_on_a_side_is_bracketed_there():
    """The issue's case: trials below the best were pruned (a low lr starts slow): the nearest is finished with the
    pruner off. With none on a side, a trial a fifth of the range beyond, past the range's end if need be. A trial
    that diverged brackets (an infinite loss)."""
    from ddl.tune.bracket import open_edges
    _, space = _split("train.lr=tag(log, interval(5e-4, 1.6e-2))")
    trials = [_sim_trial(0, 6e-4, "pruned", 2.5), _sim_trial(1, 1e-3, "pruned", 2.3),
              _sim_trial(2, 1.84e-3, value=1.87), _sim_trial(3, 4e-3, value=1.9)]
    [edge] = open_edges(trials, space)
    assert (edge.key, edge.side, edge.resume) == ("train.lr", "below", trials[1])
    trials[1].state = "complete"
    assert open_edges(trials, space) == []
    top = [_sim_trial(0, 1.6e-2, value=1.7), _sim_trial(1, 4e-3, value=1.9)]
    [edge] = open_edges(top, space)
    assert edge.side == "above" and edge.values["train.lr"] == pytest.approx(1.6e-2 * 32 ** 0.2)   # beyond the range
    assert open_edges([*top, _sim_trial(2, 3e-2, "failed")], space) == []


def test_the_search_brackets_its_best_within_its_budget_then_says_not_bracketed():
    from ddl.tune.config import TuneConfig
    from ddl.tune.workflow import next_round
    _, space = _split("train.lr=tag(log, interval(5e-4, 1.6e-2))")
    cfg = TuneConfig(trials=2, bracket_trials=1)
    trials = [_sim_trial(0, 1.6e-2, value=1.7), _sim_trial(1, 4e-3, value=1.9)]
    step = next_round(trials, space, cfg, 0, 2)
    assert step.bracketing and step.new[0]["train.lr"] > 1.6e-2 and not step.done
    trials.append(_sim_trial(2, step.new[0]["train.lr"], value=1.6))       # the trial beyond is better still
    step = next_round(trials, space, cfg, 0, 2)
    assert step.done and [str(e) for e in step.open] == ["train.lr above"]  # budget spent: not bracketed


def test_the_pruner_never_stops_a_neighbour_of_the_best():
    """A trial with no completed trial between it and the current best may bracket it: it finishes whatever its early
    loss; one beyond such a trial is pruned as before."""
    from ddl.tune.config import TuneConfig
    from ddl.tune.search import should_prune
    done = [_sim_trial(0, 2e-3, value=1.8), _sim_trial(1, 4e-3, value=1.9), _sim_trial(2, 8e-3, value=2.0)]
    for trial in done:
        trial.curve = {300: trial.value + 0.1}
    cfg = TuneConfig(prune_warmup=0.5)
    assert not should_prune(done, {300: 5.0}, 577, cfg, {"train.lr": 1e-3})      # beside the best (2e-3)
    assert should_prune(done, {300: 5.0}, 577, cfg, {"train.lr": 1.2e-2})        # beyond 4e-3 and 8e-3


@pytest.mark.parametrize("override, says", [
    ("train.lrr=interval(1e-4, 1e-2)", "train.lrr"),
    ("dv=interval(0.5, 4.5)", "dv="),
    ("train.lr=interval(-1e-3, 1e-3)", "train.lr=-0.001"),
    ("tune.trials=0", "tune.trials=0: must be an integer >= 1"),
    ("tune.replicates=0", "tune.replicates=0: must be an integer in [1, 1000)"),
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
    out = run_cli("ddl-run", "-m", *SEARCH[:-4], "tune.trials=8", "tune.seeds=auto", "tune.max_seeds=7", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "planned search (dry run, nothing launched)" in out.stdout
    assert out.stdout.count("tag(log, interval(0.0003, 0.03))") == 2 and "auto: 3, 5, 7" in out.stdout
    text = " ".join(out.stdout.split())   # 2 rows x 3 replicates x (8 trials + 2 bracket + 7 seeds)
    assert "at most 102 jobs" in text and "core-min" in text and "each searched 3 times independently" in text
    assert "Data first, before the first round's trials, here: embedded-byte-" in text
    assert not ddl_home.exists()


def test_the_command_line_replaces_a_named_sweeps_key_search_or_list(ddl_home):
    """As in Hydra's own sweepers: a list given for a key the sweep file searches makes plain rows (no search),
    and a range given for a key the sweep file lists searches it; the dry run names the keys replaced."""
    out = run_cli("ddl-run", "-m", "+sweep=tuned", "+variant=baseline", "train.lr=1e-3,2e-3", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the command line replaces the sweep's +variant, train.lr" in out.stdout
    assert "2 override sets -> 2 distinct jobs" in out.stdout and "planned search" not in out.stdout
    assert out.stdout.count("baseline-tiny-s0 train.lr=0.00") == 2 and "interval" not in out.stdout
    out = run_cli("ddl-run", "-m", "+sweep=smoke", "dv=4", "train.lr=tag(log, interval(1e-3, 1e-2))", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the command line replaces the sweep's dv" in out.stdout and "planned search" in out.stdout
    assert out.stdout.count("tag(log, interval(0.001, 0.01))") == 2 and "dv1" not in out.stdout
    assert not ddl_home.exists()


@pytest.mark.parametrize("seeds", ["seed=0,1,2", "seed=range(0,3)"])
def test_a_seed_list_beside_a_search_is_refused_pointing_to_tune_seeds(ddl_home, seeds):
    out = run_cli("ddl-run", "-m", "+sweep=tuned", seeds, "--dry-run")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith(f"ddl-run: error: {seeds}: a seed list beside a searched key") and "tune.seeds" in line
    assert not ddl_home.exists()


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
    assert len(by_search) == 4                        # 2 rows x 2 replicates
    for runs in by_search.values():   # three trials a search (and its bracket's), each once, distinct lrs in range
        numbers = sorted(int(r.data.tags["ddl.trial"]) for r in runs)
        assert numbers[:3] == [0, 1, 2] and numbers == list(range(len(numbers))) and len(numbers) <= 5
        lrs = [float(r.data.params["train.lr"]) for r in runs]
        assert len(set(lrs)) == len(lrs) and all(3e-4 <= float(r.data.params["train.lr"]) <= 3e-2 for r in runs
                                                 if int(r.data.tags["ddl.trial"]) < 3)
        assert {r.data.tags["mlflow.parentRunId"] for r in runs} != {""}
        for run in runs:                              # each step trained and logged once, resumed or not
            train_steps, _ = logged_steps(run)
            last = int(run.data.tags["ddl.pruned"].split(":")[0].removeprefix("step ")) if "ddl.pruned" in \
                run.data.tags and run.info.status != "FINISHED" else 20   # a pruned trial ends at its pruning step
            assert train_steps == sorted(set(train_steps)) and train_steps[-1] == last, train_steps
    assert {r.info.run_id for r in interrupted} <= {r.info.run_id for r in trials}   # resumed, not retrained
    confirmed = [r for r in mlflow_runs("tuned") if r.data.tags.get("ddl.role") == "confirm"]
    assert sorted(r.data.params["seed"] for r in confirmed) == sorted(["1", "1001"] * 2)   # fresh
    assert "ddl-run: tuned rows" in again.stdout
    assert third.returncode == 0 and "0 finished, 4 skipped" in third.stdout, third.stdout
    assert "search round" not in third.stdout
    assert len(mlflow_runs("tuned")) == len(trials) + len(confirmed) + 4      # and the four parent runs


@pytest.mark.slow
def test_the_report_shows_what_tuning_changed(searched, tmp_path):
    home = searched[-1]
    out = run_cli("ddl-report", "--experiment", "tuned", "--out", str(tmp_path), env_extra={"DDL_HOME": str(home)})
    assert out.returncode == 0, out.stderr[-2000:]
    report = tmp_path / "tuned"
    assert (report / "sensitivity_micro.png").stat().st_size > 10_000
    tuned = (report / "tuned.md").read_text()
    assert "Each row at its own optimum" in tuned and "best train.lr=" in tuned and "the verdict" in tuned
    assert "Micro: each row at its optimum against the tuned baseline, paired by replicate" in tuned
    line = next(line for line in tuned.splitlines() if line.startswith("| DDL (d_v=4) | 2 | "))
    assert "cost ratio 1.0" in line and "the baseline stopped early" in line      # at equal compute, from the curve
    assert "a gap at a shared learning rate" in (report / "table3.md").read_text()


@pytest.mark.slow
def test_the_batterys_search_damages_fit_a_search_of_replicates(searched, tmp_path, monkeypatch):
    """make reliability's damaged search records (scripts/hostile-inputs, minutes of searches of its own) applied to
    a copy of this module's store, a search of 2 rows x 2 replicates: each finds the record it damages. Written for
    one parent a row, the battery once stopped at the deleted parent with a traceback."""
    import importlib.machinery
    import importlib.util
    import shutil
    loader = importlib.machinery.SourceFileLoader("hostile_inputs", str(ROOT / "scripts" / "hostile-inputs"))
    battery = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(battery)
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(searched[-1] / "mlflow.db", home / "mlflow.db")
    monkeypatch.setenv("DDL_HOME", str(home))               # the battery's client sets it too: restored after
    parents = len(battery.search_runs(home, "search"))
    for _, damage in battery.search_damages():
        damage(home)
    assert len(battery.search_runs(home, "search")) == parents - 1 == 3
    assert len(mlflow_runs("elsewhere")) == 1


@pytest.mark.slow
def test_a_pruned_trial_is_marked_kept_and_not_a_failure(ddl_home):
    """Trials one at a time over a grid whose seeded order (sampler_seed=2) runs 2e-3, 2e-5, 1e-5: the second is
    beside the best and finishes whatever its loss; the third, beyond it, is far above their median at step 10 and is
    pruned there."""
    out = run_cli("ddl-run", "-m", "residual=baseline", "train.lr=choice(3e-3, 2e-3, 2e-5, 1e-5)", "model=micro",
                  "train=smoke", "train.eval_every=5", "tune.trials=3", "tune.parallel=1", "tune.seeds=1",
                  "tune.replicates=1", "tune.sampler_seed=2", "experiment=pruned")
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
    """Home a runs one trial of a search; home b, sharing only the server, asks for two: it finds a's parent
    run and trial there and trains the second alone."""
    from mlflow.tracking import MlflowClient
    search = ["-m", "residual=baseline", "train.lr=tag(log, interval(1e-3, 1e-2))", "model=micro", "train=smoke",
              "tune.seeds=1", "tune.replicates=1", "tune.bracket_trials=0", "experiment=team-search"]
    env = {"MLFLOW_TRACKING_URI": team_server.uri}
    first = run_cli("ddl-run", *search, "tune.trials=1", env_extra={**env, "DDL_HOME": str(tmp_path / "a")})
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli("ddl-run", *search, "tune.trials=2", env_extra={**env, "DDL_HOME": str(tmp_path / "b")})
    assert second.returncode == 0 and "search round: 1 trial\n" in second.stdout, second.stdout[-3000:]
    client = MlflowClient(team_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("team-search").experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("ddl.role") == "search"]
    trials = sorted((r for r in runs if r.data.tags.get("ddl.role") == "trial"), key=lambda r: r.data.tags["ddl.trial"])
    assert [r.data.tags["ddl.trial"] for r in trials] == ["0", "1"]
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {parent.info.run_id}
    homes = [r.data.tags["ddl.home"] for r in trials]
    assert homes == [str(tmp_path / "a"), str(tmp_path / "b")]


def _race(search: list[str], team_server, tmp_path) -> list[tuple[str, str]]:
    """The same search started by two homes (a, b) at once on the team server; each ends with exit 0."""
    homes = [subprocess.Popen([*console_script("ddl-run"), *search], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "DDL_HOME": str(tmp_path / home),
                                              "MLFLOW_TRACKING_URI": team_server.uri})
             for home in "ab"]
    outs = [home.communicate(timeout=1200) for home in homes]
    assert [home.returncode for home in homes] == [0, 0], [out[1][-3000:] for out in outs]
    return outs


@pytest.mark.slow
def test_two_homes_racing_one_search_make_one_parent_each_trial_and_confirmation_once(team_server, tmp_path):
    """Two homes start the same search at the same moment on the team server: the parent run, each trial number
    and each confirmation run are claimed like a signature, so each row has one parent, tune.trials trials with
    distinct numbers and tune.seeds confirmation runs (fresh seeds), and every run trained once (each home waits
    for the other's). The space is a choice, so every best is bracketed and confirmed: over a range, which trial is
    best hangs on losses a thousandth apart, and a best at the range's edge (no bracket trials here) is confirmed
    by neither home."""
    from mlflow.tracking import MlflowClient
    search = ["-m", "residual=ddl,baseline", "dv=4", "train.lr=choice(3e-3, 1e-2, 3e-2, 1e-1, 3e-1)", "tune.trials=4",
              "tune.seeds=2", "tune.replicates=1", "tune.bracket_trials=0", "tune.pruner=none", "model=micro",
              "train=smoke", "train.steps=40", "experiment=raced"]
    outs = _race(search, team_server, tmp_path)
    client = MlflowClient(team_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("raced").experiment_id])
    parents = [r for r in runs if r.data.tags.get("ddl.role") == "search"]
    assert len(parents) == 2 and len({p.data.tags["ddl.search"] for p in parents}) == 2
    for parent in parents:
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        trials = [r for r in children if r.data.tags["ddl.role"] == "trial"]
        assert sorted(int(r.data.tags["ddl.trial"]) for r in trials) == [0, 1, 2, 3], [
            (r.data.tags["ddl.trial"], r.data.tags["ddl.signature"], r.data.tags["ddl.home"][-1], r.info.start_time,
             r.info.status) for r in trials]
        assert sorted(r.data.params["seed"] for r in children if r.data.tags["ddl.role"] == "confirm") == ["1", "2"], \
            [out[0][-2000:] for out in outs]
    trained = [r.data.tags["ddl.signature"] for r in runs if r.data.tags.get("ddl.role") in ("trial", "confirm")]
    assert len(trained) == len(set(trained)) == 12 and all(r.info.status == "FINISHED" for r in runs)


def test_a_trial_number_two_homes_claim_at_once_is_trained_by_at_most_one(ddl_home):
    """The race start times cannot settle: B, stamped later, looked before A's run landed and passed; A, stamped
    earlier, passes its first look too (B started later). Each marks itself won, then looks again: the later
    second look (A's) sees B's mark, and A leaves. Without the second look both trained trial 2 (two values)."""
    from ddl.track import searches, store
    c, experiment = store.client(), "raced-numbers"
    tags = {searches.SEARCH_TAG: "s", searches.ROLE_TAG: "trial", searches.TRIAL_TAG: "2"}
    b = c.create_run(store.experiment_id(experiment), start_time=2000, tags={**tags, store.SIGNATURE_TAG: "b"})
    assert searches.trial_taken(experiment, "s", 2, "b", besides=b) is None          # A has not landed
    a = c.create_run(store.experiment_id(experiment), start_time=1000, tags={**tags, store.SIGNATURE_TAG: "a"})
    assert searches.trial_taken(experiment, "s", 2, "a", besides=a) is None          # B was stamped later
    c.set_tag(b.info.run_id, searches.WON_TAG, "1")
    assert searches.trial_won_elsewhere(experiment, "s", 2, b) is None               # A not marked yet: B trains
    c.set_tag(a.info.run_id, searches.WON_TAG, "1")
    assert searches.trial_won_elsewhere(experiment, "s", 2, a).startswith(f"trial 2 is MLflow run {b.info.run_id}")
    other = c.create_run(store.experiment_id(experiment), tags={**tags, searches.TRIAL_TAG: "3",
                                                                 searches.WON_TAG: "1"})
    assert searches.trial_won_elsewhere(experiment, "s", 3, other) is None           # its own mark is no rival


@pytest.mark.slow
def test_two_homes_racing_a_search_over_a_range_number_each_trial_once(team_server, tmp_path):
    """Over a continuous range the two homes' draws differ, so one trial number may be asked with two values at
    once: each number is trained by one run (the claim's two looks), and the numbers run 0..trials-1."""
    from mlflow.tracking import MlflowClient
    search = ["-m", "residual=baseline", "train.lr=tag(log, interval(1e-3, 3e-2))", "tune.trials=4", "tune.seeds=1",
              "tune.replicates=1", "tune.bracket_trials=0", "tune.pruner=none", "model=micro", "train=smoke",
              "train.steps=10", "experiment=raced-range"]
    _race(search, team_server, tmp_path)
    client = MlflowClient(team_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("raced-range").experiment_id])
    numbers = sorted(int(r.data.tags["ddl.trial"]) for r in runs if r.data.tags.get("ddl.role") == "trial")
    assert numbers == [0, 1, 2, 3], [(r.data.tags.get("ddl.trial"), r.data.tags.get("ddl.home", "")[-1],
                                      r.info.status) for r in runs]


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
    home_runs = [r for r in mlflow_runs("tuned") if r.data.tags.get("ddl.role") in ("trial", "confirm")]
    assert len(parents) == 4 and len(children) == len(home_runs)
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


def _stored_trial(client, experiment_id: str, number: str, values: str, search: str = "s1") -> str:
    """A finished trial run as the driver's jobs tag one, in a real MLflow store."""
    run = client.create_run(experiment_id, tags={"ddl.search": search, "ddl.role": "trial", "ddl.trial": number,
                                                 "ddl.trial_values": values, "ddl.sweep": "e",
                                                 "ddl.signature": f"sig{number}"})
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_damaged_search_records_are_left_out_each_in_one_warning_line(ddl_home, capsys):
    """A garbled ddl.trial_values or ddl.trial tag, values of other keys, a trial moved to another experiment:
    the search reads on without each, saying so once; a damaged trial keeps its number."""
    from ddl.track import searches, store
    c = store.client()
    here = store.experiment_id("e")
    good = _stored_trial(c, here, "0", '{"train.lr": 0.001}')
    damaged = [_stored_trial(c, here, "1", '{"train.lr": 0.00'), _stored_trial(c, here, "2", '{"train.lrr": 0.001}'),
               _stored_trial(c, here, "x", '{"train.lr": 0.002}'),
               _stored_trial(c, store.experiment_id("elsewhere"), "3", '{"train.lr": 0.003}')]
    assert [t.run_id for t in searches.runs_of("e", "s1", keys=["train.lr"])] == [good]
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[4].rstrip(":") for line in lines] == damaged
    assert all(line.startswith("ddl-run: warning: MLflow run ") and line.endswith("the search goes on without it")
               for line in lines)
    assert "ddl.trial_values='{\"train.lr\": 0.00'" in lines[0] and "experiment 'elsewhere', not 'e'" in lines[3]
    assert [t.run_id for t in searches.runs_of("e", "s1", keys=["train.lr"])] == [good]
    assert capsys.readouterr().out == ""                                          # said once
    assert searches.numbers_taken("e", "s1") == {0, 1, 2}


def test_a_trial_number_is_claimed_like_a_signature(ddl_home):
    """Two runs of one trial number with other values: the one that started first holds it."""
    from ddl.track import searches, store
    c = store.client()
    here = store.experiment_id("e")
    first, later = (c.get_run(_stored_trial(c, here, "0", '{"train.lr": 0.001}')),
                    c.get_run(_stored_trial(c, here, "0", '{"train.lr": 0.002}')))
    later_sig = later.data.tags["ddl.signature"]
    c.set_tag(later.info.run_id, "ddl.signature", "other")
    assert searches.trial_taken("e", "s1", 0, "other", besides=c.get_run(later.info.run_id)).startswith(
        f"trial 0 is MLflow run {first.info.run_id}")
    assert searches.trial_taken("e", "s1", 0, later_sig, besides=first) is None
    assert searches.trial_taken("e", "s1", 1, "other") is None


def test_a_deleted_parent_run_is_refused_in_one_line_naming_it(ddl_home):
    """A search's parent deleted (in MLflow's UI) while its trials are not: refused, naming the parent and how to
    restore it; with its trials deleted too, the search starts afresh under a new parent."""
    from ddl.track import searches, store
    c = store.client()
    parent = searches.parent_run("e", "s1", "search baseline-micro", {})
    assert searches.parent_run("e", "s1", "search baseline-micro", {}) == parent
    trial = _stored_trial(c, store.experiment_id("e"), "0", '{"train.lr": 0.001}')
    c.set_tag(trial, "mlflow.parentRunId", parent)
    c.delete_run(parent)
    with pytest.raises(searches.DamagedSearch, match=f"^search baseline-micro: its parent MLflow run {parent} is "
                                                     f"deleted .*mlflow runs restore --run-id {parent}"):
        searches.parent_run("e", "s1", "search baseline-micro", {})
    with pytest.raises(searches.DamagedSearch, match=f"parent MLflow run {parent} was deleted while it ran"):
        searches.close("s1", parent)
    c.delete_run(trial)
    assert searches.parent_run("e", "s1", "search baseline-micro", {}) not in ("", parent)


def test_a_replica_is_an_independent_copy_of_its_row_in_the_signature():
    """replica=0 is the run itself (its signature unchanged); another replica pairs with it by seed but draws its own
    init and data order, and enters the signature."""
    from dataclasses import replace

    from ddl.data import DataConfig
    from ddl.model import model_config
    from ddl.train import RunConfig, TrainConfig
    data = DataConfig()
    run = RunConfig(model_config("micro", vocab_size=data.model_vocab_size(), residual="baseline"), data, TrainConfig())
    assert "replica" not in run.effective_dict() and run.rng_seed == run.seed == 0
    copy = replace(run, replica=1)
    assert copy.signature() != run.signature() and copy.effective_dict()["replica"] == 1
    assert copy.rng_seed not in (run.rng_seed, replace(run, replica=2).rng_seed)
    with pytest.raises(ValueError, match=r"^replica=-1: must be an integer"):
        replace(run, replica=-1)
