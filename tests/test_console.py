"""What ddl-run shows: progress where output is a file, the live table at 80 columns, reused jobs said
as such (and not launched), dry runs whose names and columns say what differs. The Hydra app in a
subprocess, the submitit local executor, a real MLflow store; the terminal is a real pseudo-terminal."""

import re
import time

import pytest

from tests.conftest import mlflow_runs, run_cli, run_cli_in_terminal

SMOKE = ["model=micro", "train=smoke", "train.steps=300", "train.eval_every=100", "train.ckpt_every=100"]  # ~10 s
PROGRESS = re.compile(r"^\d\d:\d\d:\d\d (\S+) \[([0-9a-f]{12})\]: step (\d+)/300(.*)$", re.M)


@pytest.fixture(scope="module")
def trained(module_ddl_home):
    """Experiment `first`: seed 0 as a single run, then the sweep over seeds 0 and 1 (seed 1 trains),
    both with output to a pipe, as in a log file."""
    single = run_cli("ddl-run", *SMOKE, "experiment=first", "seed=0", env_extra={"DDL_PROGRESS_S": "0.01"})
    assert single.returncode == 0, single.stdout[-3000:] + single.stderr[-3000:]
    sweep = run_cli("ddl-run", "-m", *SMOKE, "experiment=first", "seed=0,1", env_extra={"DDL_PROGRESS_S": "0.5"})
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    return single.stdout, sweep.stdout


@pytest.mark.slow
def test_a_single_run_off_a_terminal_prints_progress_lines(trained):
    single, _ = trained
    lines = PROGRESS.findall(single)
    assert [int(step) for _, _, step, _ in lines] == list(range(5, 301, 5)), single   # every logged step at 0.01 s
    assert all(name == "ddl_dv1-micro-s0" for name, *_ in lines)
    assert ", train loss " in lines[0][3] and " tok/s" in lines[0][3] and ", ETA 00:00:00" in lines[-1][3]
    assert ", val loss " in lines[-1][3]
    assert "train/loss=" not in single                                            # the old raw lines


@pytest.mark.slow
def test_a_sweep_off_a_terminal_prints_a_line_per_running_job(trained):
    _, sweep = trained
    lines = PROGRESS.findall(sweep)
    assert {name for name, *_ in lines} == {"ddl_dv1-micro-s1"}, sweep           # seed 0 is done
    steps = [int(step) for _, _, step, _ in lines]
    # lines while it trains: the launcher polls each second, and seed 1's 300 steps take 2-10 s on 2 cores
    assert steps == sorted(steps) and len(set(steps)) >= 2, sweep
    assert re.search(r"^\d\d:\d\d:\d\d ddl_dv1-micro-s1 \[[0-9a-f]{12}\]: finished$", sweep, re.M), sweep
    assert "1 finished, 1 skipped, 0 failed or stopped" in sweep


@pytest.mark.slow
def test_jobs_finished_in_another_experiment_are_reused_without_launching_anything(trained, module_ddl_home):
    started = time.monotonic()
    out = run_cli("ddl-run", "-m", *SMOKE, "experiment=second", "seed=0,1")
    elapsed = time.monotonic() - started
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for seed in (0, 1):                                                            # its line, its summary row
        assert re.search(rf"^ddl_dv1-micro-s{seed} \[\w+\]: reused \(from experiment first\): MLflow run", out.stdout,
                         re.M), out.stdout
        assert f"│ ddl_dv1-micro-s{seed} │ reused (from experiment first) │ val/loss" in out.stdout, out.stdout
    assert "0 finished, 2 reused (from experiment first), 0 skipped, 0 failed or stopped" in out.stdout
    assert not list((module_ddl_home / "sweeps" / "second").rglob("*.out")), "a job was launched"
    assert elapsed < 300, f"took {elapsed:.0f} s"               # a bound (a launched job waits), not a timing
    from ddl.track import store
    c = store.client()
    first = {r.data.tags["ddl.signature"]: r for r in mlflow_runs("first")}
    for run in mlflow_runs("second"):
        source = first[run.data.tags["ddl.signature"]]
        assert run.info.status == "FINISHED" and run.data.tags["ddl.reused_from"] == "first"
        assert run.data.tags["ddl.history_from"] == source.info.run_id
        assert run.data.metrics["final/val/loss"] == source.data.metrics["final/val/loss"]
        curve = [(m.step, m.value) for m in c.get_metric_history(source.info.run_id, "train/loss")]
        assert sorted((m.step, m.value) for m in c.get_metric_history(run.info.run_id, "train/loss")) == sorted(curve)
    again = run_cli("ddl-run", "-m", *SMOKE, "experiment=second", "seed=0,1")
    assert "0 finished, 2 skipped, 0 failed or stopped" in again.stdout and len(mlflow_runs("second")) == 2


@pytest.mark.slow
def test_the_live_table_fits_80_columns(trained):
    """At a terminal 80 columns wide: two reused jobs and one that trains, every line of the tables within 80
    (a plain line longer than that is the terminal's to wrap)."""
    code, shown = run_cli_in_terminal("ddl-run", "-m", *SMOKE, "experiment=third", "seed=0,1,2", columns=80)
    assert code == 0, shown[-3000:]
    lines = [line for line in shown.splitlines() if set(line) & set("┏┃┡│└")]
    assert len(lines) > 20 and max(map(len, lines)) <= 80, max(lines, key=len)
    rows = [line for line in lines if line.startswith("│")]
    assert any("│ ddl_dv1-micro-s0 │ reused (from experiment first) │" in row for row in rows), shown[-3000:]
    assert any("│ ddl_dv1-micro-s2 │ running" in row for row in rows), shown[-3000:]
    assert "…" not in shown and not any(re.search(r"┃ id +┃", line) for line in lines)


def test_a_dry_run_names_each_job_by_what_differs_and_states_the_shared_overrides_once(ddl_home):
    out = run_cli("ddl-run", "-m", "+sweep=beta_init", "--dry-run")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("│")]
    names = [row.split("│")[1].strip() for row in rows]
    assert names == [f"ddl_dv{dv}-tiny-s0 beta_init={b}" for dv in (1, 4) for b in (0.1, 0.5, 1.0, 1.5, 1.9)]
    assert not any("+sweep=beta_init" in row or "dry_run" in row for row in rows)
    assert "Every job: +sweep=beta_init." in " ".join(out.stdout.split())
    assert "CPU core-min" in out.stdout and "GPU-h" not in out.stdout          # the local launcher gives no GPU
    assert "10 jobs, 10 to run." in out.stdout
    assert not (ddl_home / "mlflow.db").exists() and not (ddl_home / "runs").exists()


def test_one_job_reads_in_the_singular(ddl_home):
    out = run_cli("ddl-run", "-m", *SMOKE, "--dry-run", "hydra.launcher.max_parallel=1")
    assert out.returncode == 0, out.stderr[-3000:]
    text = " ".join(out.stdout.split())
    assert "1 override set -> 1 distinct job" in text and "1 job, 1 to run." in text
    assert "with 1 job at once x 1 thread." in text and "(s)" not in text


@pytest.mark.slow
def test_a_dry_run_marks_the_jobs_already_done(trained):
    here = run_cli("ddl-run", "-m", *SMOKE, "experiment=first", "seed=0,1,7", "--dry-run")
    assert here.returncode == 0, here.stderr[-3000:]
    assert here.stdout.count("finished (skipped)") == 2 and "2 finished" not in here.stdout
    assert "3 jobs, 1 to run." in " ".join(here.stdout.split())
    elsewhere = run_cli("ddl-run", "-m", *SMOKE, "experiment=fourth", "seed=0,1", "--dry-run")
    assert elsewhere.stdout.count("reused (from experiment first)") == 2, elsewhere.stdout
    assert "2 jobs, 0 to run." in " ".join(elsewhere.stdout.split())


@pytest.mark.parametrize(("mode", "variable", "value", "default"), [
    ([], "DDL_PROGRESS_S", "soon", "30"), (["-m"], "DDL_PROGRESS_S", "soon", "30"),
    (["-m"], "DDL_LOST_AFTER_S", "0", "120")])
def test_a_bad_interval_is_one_line(ddl_home, mode, variable, value, default):
    out = run_cli("ddl-run", *mode, *SMOKE, env_extra={variable: value})
    assert out.returncode == 2
    assert out.stderr.strip() == (f"ddl-run: error: {variable}={value!r}: must be a number of seconds > 0 "
                                  f"(default {default})")
    assert not (ddl_home / "runs").exists() and not (ddl_home / "mlflow.db").exists()
