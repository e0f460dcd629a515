"""`make bench` end to end (quick mode): every arm measured against the baseline and written out.

Figures are not asserted against the targets here (timings belong to the bench, not to tests);
what is asserted is that each one was measured, relative to the same-run baseline, and rendered.
"""

import json
import shutil
import subprocess

import pytest

from ddl.bench import ARMS, MEMORY_TARGET, model_table
from ddl.costs import RECORDED_COSTS
from tests.conftest import python_module


# An arm of each kind (the rest differ only in the model they build, which the model's tests cover: the compiled
# twins' kernels, inductor's C++ here, ~18 s of CPU on a cold cache, test_model_gpt's compiled kernels; their
# targets, test_a_compiled_twin_is_judged_against_its_own_kind): make bench measures all of ddl.bench.ARMS.
KINDS = ["baseline", "ddl_dv1", "ddl_dv4", "ddl_dv1_nh2", "ddl_dv4_nh2"]


@pytest.mark.slow
def test_quick_bench_writes_each_arm_as_a_ratio_to_the_baseline(tmp_path, ddl_home):
    out, figures = tmp_path / "bench", tmp_path / "recorded_costs.json"
    shutil.copy(RECORDED_COSTS, figures)
    done = subprocess.run([*python_module("ddl.bench"), "--quick", "--model", "--arms", ",".join(KINDS),
                           "--out", str(out), "--record", str(figures)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "bench.json").read_text())
    rows = result["model"]
    assert list(rows) == KINDS and set(KINDS) <= set(ARMS)
    assert result["machine"]["fused_loops"] == "C++"                      # what the CPU figures are of
    assert rows["baseline"]["time_ratio"] == 1.0 and rows["baseline"]["memory_ratio"] == 1.0
    for name, row in rows.items():
        assert row["step_ms"] > 0 and row["tokens_per_s"] > 0, name
        assert row["time_ratio"] == pytest.approx(row["step_ms"] / rows["baseline"]["step_ms"]), name
    # the state grows with d_v: more activation memory than the baseline, more for d_v=4 than 1
    assert 1.0 < rows["ddl_dv1"]["memory_ratio"] < rows["ddl_dv4"]["memory_ratio"]
    for dv in (1, 4):                                                  # a second Delta step: its own maps
        assert rows[f"ddl_dv{dv}_nh2"]["params"] > rows[f"ddl_dv{dv}"]["params"]
    assert "orchestrator" not in result                # --model: the next test's figures
    assert 0 < result["logging"]["fraction_of_step"] < 1
    markdown = (out / "bench.md").read_text()
    assert markdown in done.stdout and "replaced by run" not in done.stdout   # each logging measure: its own run
    for name in KINDS:
        assert f"| {name} |" in markdown
    # --record: the measured arms' ratios replace theirs among the recorded CPU figures, the others stay
    recorded, before = json.loads(figures.read_text()), json.loads(RECORDED_COSTS.read_text())
    ratios = recorded["cpu"]["step_ratios"]
    assert ratios["ddl dv=4 conv=none mapping=k n_h=1 beta=linear"] == rows["ddl_dv4"]["time_ratio"]
    assert ratios["ddl dv=1 conv=none mapping=k n_h=2 beta=linear"] == rows["ddl_dv1_nh2"]["time_ratio"]
    assert ratios["ddl dv=4 conv=cc mapping=k n_h=1 beta=linear"] == \
        before["cpu"]["step_ratios"]["ddl dv=4 conv=cc mapping=k n_h=1 beta=linear"]
    assert recorded["gpu"] == before["gpu"] and recorded["cpu"]["machine"] == result["machine"]["device"]


@pytest.mark.slow
def test_the_orchestrator_alone_times_start_up_the_plan_of_1000_jobs_and_a_sweep_warm_and_cold(tmp_path, ddl_home):
    out = tmp_path / "bench"
    done = subprocess.run([*python_module("ddl.bench"), "--orchestrator", "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    orchestrator = json.loads((out / "orchestrator.json").read_text())["orchestrator"]
    assert orchestrator["help_s"] > 0 and orchestrator["smoke_sweep_to_first_step_s"] > 0
    assert orchestrator["dry_run_paper_small_s"] > 0
    assert orchestrator["plan_1000_s"] > 0 and len(orchestrator["plan_1000_cpu_runs_s"]) == 1   # --quick: 1 run
    for warm in ("true", "false"):           # a sweep's jobs forked from a warm server, and cold: wall and CPU
        wall, cpu = orchestrator[f"sweep_warm_{warm}_s"]
        assert wall > 0 and cpu > 0
    assert len(orchestrator["plan_1000_stored_runs_s"]) == 1 and orchestrator["plan_1000_stored_runs_s"][0] > 0
    markdown = (out / "orchestrator.md").read_text()
    assert markdown in done.stdout and "| plan of 1,000 jobs" in markdown and not (out / "bench.json").exists()
    assert "| local sweep of 2 micro jobs" in markdown                     # --quick: 2 jobs
    assert "| plan of 1,000 jobs in that sweep's home (its store: 2 finished runs) |" in markdown


@pytest.mark.parametrize("mode", ["--dispatch", "--orchestrator", "--model"])
def test_an_unknown_arm_is_refused_in_one_line_whichever_figures_were_asked_for(tmp_path, mode):
    done = subprocess.run([*python_module("ddl.bench"), mode, "--arms", "baseline,no\nsuch",
                           "--out", str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        f"python -m ddl.bench: error: --arms: 'no\\nsuch' unknown; allowed: {', '.join(ARMS)}"], done.stderr
    assert not (tmp_path / "b").exists() and not done.stdout


def test_a_compiled_twin_is_judged_against_its_own_kind():
    """The step-time bounds of model_table: d_v=4 at 1.25x, each convolution within 1.05x of the d_v=4 arm of its own
    kernels (fused or compiled), DeltaProduct at d_v=1 unbounded; the memory bound on both d_v=4 arms."""
    ratios = {"baseline": 1.0, "ddl_dv4": 1.2, "ddl_dv4_cc": 1.27, "ddl_dv4_compiled": 1.4,
              "ddl_dv4_cc_compiled": 1.46, "ddl_dv1_nh2": 3.0}
    rows = {name: {"step_ms": 10 * ratio, "time_ratio": ratio, "tokens_per_s": 100 / ratio, "memory_mib": 1.0,
                   "memory_ratio": 1.0 if name == "baseline" else 1.2} for name, ratio in ratios.items()}
    cells = {line.split(" | ")[0].removeprefix("| "): line.split(" | ") for line in model_table(rows)[2:]}
    assert {name: row[3] for name, row in cells.items()} == {
        "baseline": "", "ddl_dv4": "<= 1.25 ok", "ddl_dv4_cc": "<= 1.26 MISSED", "ddl_dv4_compiled": "<= 1.25 MISSED",
        "ddl_dv4_cc_compiled": "<= 1.47 ok", "ddl_dv1_nh2": ""}
    bounded = [name for name, row in cells.items() if f"(<= {MEMORY_TARGET} ok)" in row[-1]]
    assert bounded == ["ddl_dv4", "ddl_dv4_compiled"]


def test_the_dispatch_bench_measures_the_delta_arms_on_one_thread_against_the_baseline():
    """--dispatch's eager half (its compiled half is model_costs compiling per block, as make bench does): one
    thread while it measures, the thread count given back, a row per arm with its target and its host time by
    phase."""
    import torch

    from ddl.bench import DISPATCH_TARGETS, dispatch_costs, dispatch_markdown
    threads = torch.get_num_threads()
    result = {"machine": "this CPU", "dispatch": dispatch_costs(1, 1, ("eager",))}
    assert torch.get_num_threads() == threads
    rows = result["dispatch"]["eager"]
    assert list(rows) == ["baseline", "ddl_dv1", "ddl_dv4"] and rows["baseline"]["time_ratio"] == 1.0
    assert rows["ddl_dv4"]["params"] > rows["ddl_dv1"]["params"] > rows["baseline"]["params"]
    for row in rows.values():                   # one step's phases add up to its host time (one step: no medians)
        assert list(row["host_phases_ms"]) == ["forward", "backward", "optimizer"]
        assert sum(row["host_phases_ms"].values()) == pytest.approx(row["host_ms"], rel=1e-6)
    text = dispatch_markdown(result)
    for name, target in DISPATCH_TARGETS["eager"].items():
        forward = rows[name]["host_phases_ms"]["forward"]
        assert f"| eager | {name} | {rows[name]['step_ms']:.2f} | {rows[name]['time_ratio']:.3f} | <= {target} " in text
        assert f" | {forward:.2f} ({forward / rows['baseline']['host_phases_ms']['forward']:.2f}) | " in text


@pytest.mark.parametrize("args, refusal", [
    (["--rounds", "0"], "argument --rounds: '0': must be an integer >= 1"),
    (["--steps", "nan"], "argument --steps: 'nan': must be an integer >= 1"),
    (["--out", "bench\nout"], "argument --out: 'bench\\nout': must be a non-empty path of printable characters"),
])
def test_the_bench_refuses_a_bad_count_or_path_in_its_error_line(tmp_path, args, refusal):
    """A count below 1 ended in a traceback after the arms were built; a newline in --out made a directory."""
    done = subprocess.run([*python_module("ddl.bench"), "--dispatch", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(refusal), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr   # the error line alone, no usage
    assert list(tmp_path.iterdir()) == []
