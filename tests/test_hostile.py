"""Hostile input: checked at the edge, one line naming the key, the value and what is allowed, a non-zero exit,
and nothing created (no store, no run, no folder): names that become paths or script lines, values that pass
a type check but cannot train, and the other entry points' arguments."""

import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import python_module, run_cli

SMOKE = ["model=micro", "train=smoke"]


def assert_one_line(out, prefix, message, code=2):
    lines = out.stderr.strip().splitlines() if prefix.startswith("ddl-run") else out.stdout.strip().splitlines()
    assert out.returncode == code, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr
    assert len(lines) == 1 and lines[0].startswith(prefix) and message in lines[0], lines[-5:]


@pytest.mark.parametrize("override, message", [
    ("experiment=.", "experiment='.': must be a non-empty name of at most 64 letters"),
    ("experiment=..", "experiment='..': must be a non-empty name"),
    ('experiment="a\nb"', "experiment='a\\nb': must be a non-empty name"),
    ("experiment=" + "x" * 5000, "characters): must be a non-empty name"),
    ("ddl.k_eps=nan", "k_eps=nan: must be a finite number >= 0"),
    ("ddl.v_sigmoid_scale=inf", "v_sigmoid_scale=inf: must be a finite number >= 0"),
    ("model.rope_base=0", "rope_base=0.0: must be a finite number > 0"),
    ("model.init_std=-1", "init_std=-1.0: must be a finite number > 0"),
    ("seed=" + "9" * 40, "seed=9999999999"),
    ("ddl.read_init=abc", "ddl.read_init='abc': must be a number or null"),
    ("ddl.read_init=inf", "read_init=inf: must be null (1/d_v) or a finite number"),
    ("data=files data.files=/nonexistent/*.txt", "data.files='/nonexistent/*.txt': matches no file"),
    ("train.device=cuda", "train.device='cuda': this machine has no CUDA device"),
    ("ddl.n_h=nan", "ddl.n_h=nan: must be an integer"),
    ("train.compile_mode=fast", "train.compile_mode='fast': must be one of default, reduce-overhead, max-autotune"),
    ("train.compile_mode=reduce-overhead", "train.compile_mode='reduce-overhead': needs train.compile=true"),
    ("ddl.n_h=1\n2", "'ddl.n_h=1\\n2': not an override Hydra can parse: key=value, a value with spaces"),
])
@pytest.mark.slow
def test_bad_values_are_one_line_before_anything_is_created(ddl_home, override, message):
    import torch
    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = run_cli("ddl-run", *SMOKE, *([override] if "\n" in override else override.split()))
    assert_one_line(out, "ddl-run: error: ", message)
    assert_nothing_created(ddl_home)


def assert_nothing_created(home):
    """Nothing in DDL_HOME (no store, no run folder, no Hydra run folder, no half-built dataset, not an empty
    folder) and nothing beside it."""
    assert not home.exists() or not any(home.iterdir()), sorted(home.rglob("*"))
    assert [p.name for p in home.parent.iterdir()] in ([], [home.name])


def test_a_run_refused_after_hydra_started_takes_away_what_hydra_wrote(ddl_home):
    """Hydra writes the run's folder (.hydra/, its log) before ddl's checks run: the refusal removes it, and
    keeps an earlier run's folder beside it."""
    earlier = ddl_home / "hydra" / "default" / "2000-01-01_00-00-00"
    earlier.mkdir(parents=True)
    (earlier / "cli.log").write_text("an earlier run's log\n")
    out = run_cli("ddl-run", *SMOKE, "ddl.k_eps=nan")
    assert_one_line(out, "ddl-run: error: ", "k_eps=nan: must be a finite number >= 0")
    assert sorted(p.relative_to(earlier.parent) for p in ddl_home.rglob("*") if earlier.parent in p.parents) == [
        Path(earlier.name), Path(earlier.name, "cli.log")]


@pytest.mark.slow
def test_a_misspelt_eval_task_is_found_before_training(ddl_home):
    out = run_cli("ddl-run", *SMOKE, "eval.tasks=[arc_easyy]", "eval.shots=[0]")
    assert_one_line(out, "ddl-run: error: ", "eval.tasks='arc_easyy': not an lm-eval task; did you mean arc_easy")
    assert_nothing_created(ddl_home)


@pytest.mark.slow
def test_a_file_that_is_not_utf8_stops_a_run_in_one_line_of_its_own_and_leaves_nothing(ddl_home, tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    (corpus / "a.txt").write_text("An English document. " * 100)
    (corpus / "b.txt").write_bytes("Un café, s'il vous plaît. ".encode("latin-1") * 100)
    out = run_cli("ddl-run", *SMOKE, "data=files", f"data.files={corpus}/*.txt", "data.tokenizer=byte")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == (
        f"ddl-run: error: data.files='{corpus}/*.txt': {corpus / 'b.txt'}: not utf-8 at byte 6 (0xe9); set "
        "data.encoding=<the files' encoding> (latin-1, cp1252, ...) or data.encoding_errors=replace (or ignore)")
    assert out.stderr.count("ddl-run:") == 1                      # the tokenizing bar's line ended before it
    assert_nothing_created(ddl_home)


def test_a_newline_in_a_launcher_setting_never_reaches_a_job_script(ddl_home):
    out = run_cli("ddl-run", "-m", *SMOKE, 'hydra.launcher.name="x\n#SBATCH --wrap=touch /tmp/owned"')
    assert_one_line(out, "ddl-run: error: ", "hydra.launcher.name='x\\n#SBATCH --wrap=touch /tmp/owned': must be "
                                             "printable, on one line")
    assert_nothing_created(ddl_home)


@pytest.mark.parametrize("uri, message", [
    ("http://127.0.0.1:9", "MLFLOW_TRACKING_URI=http://127.0.0.1:9: no MLflow server answers"),
    ("garbage://x", "MLFLOW_TRACKING_URI=garbage://x: not a usable MLflow store"),
])
def test_an_unusable_tracking_uri_fails_fast_in_one_line(ddl_home, uri, message):
    started = time.monotonic()
    out = run_cli("ddl-run", *SMOKE, env_extra={"MLFLOW_TRACKING_URI": uri})
    assert_one_line(out, "ddl-run: error: ", message)
    assert time.monotonic() - started < 120                             # not MLflow's minutes of retries
    assert_nothing_created(ddl_home)


@pytest.mark.parametrize("name", [".", "..", "../escape", "a\nb"])
def test_a_report_is_never_written_outside_its_own_folder(ddl_home, tmp_path, name):
    reports = tmp_path / "reports"
    (reports / "kept").mkdir(parents=True)
    out = run_cli("ddl-report", "--experiment", name, "--out", str(reports))
    assert_one_line(out, "ddl-report: error: ", "--experiment=")
    assert [p.name for p in reports.iterdir()] == ["kept"] and not (tmp_path / "escape").exists()


def test_other_entry_points_refuse_bad_arguments_in_one_line(ddl_home):
    out = run_cli("ddl-eval", "nothing", "--shots", "-1")
    assert_one_line(out, "ddl-eval: error: ", "eval.shots=[-1]: must be a list of integers >= 0")
    out = run_cli("ddl-ui", "--port", "99999")
    assert out.returncode == 2 and "--port='99999': must be an integer in [1, 65535]" in out.stderr
    assert "Traceback" not in out.stderr and not (ddl_home / "mlflow.db").exists()


@pytest.mark.parametrize("args, message", [
    (["-m", "hydra/launcher=slurm", "hydra.launcher.prepare_cpus_per_task=0", "--dry-run"],
     "hydra.launcher.prepare_cpus_per_task=0: must be an integer >= 1"),
    (["train.warmup_frac=0.1", "train.warmup_steps=5"],
     "train.warmup_steps=5: train.warmup_frac=0.1 sets the warmup (round(0.1 * train.steps)); give one"),
    (["-m", "+sweep=transfer", "train.warmup_steps=5", "--dry-run"],
     "train.warmup_steps=5: train.warmup_frac=0.052 sets the warmup"),
    (["-m", "residual=ddl,baseline", "tune.trials=5"], "tune.trials=5: nothing is searched, so a plain run would "
                                                       "ignore it; search a key"),
    (["tune.replicates=2"], "tune.replicates=2: nothing is searched"),
])
def test_a_setting_the_run_would_ignore_is_one_line(ddl_home, args, message):
    flags = args[:1] if args[:1] == ["-m"] else []
    out = run_cli("ddl-run", *flags, *SMOKE, *args[len(flags):])
    assert_one_line(out, "ddl-run: error: ", message)
    assert_nothing_created(ddl_home)


def test_what_a_plain_sweep_reads_of_tune_is_taken(ddl_home):
    out = run_cli("ddl-run", "-m", *SMOKE, "residual=ddl,baseline", "tune.max_seeds=5", "--dry-run")
    assert out.returncode == 0 and "2 distinct jobs" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("workers", ["0", "-3", "many"])
def test_a_bad_worker_count_is_one_line_without_the_usage(ddl_home, workers):
    out = run_cli("ddl-data", "prepare", "--workers", workers)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2 and lines == [f"ddl-data prepare: error: argument --workers: {workers!r}: must be an "
                                             f"integer >= 1"], lines
    assert_nothing_created(ddl_home)


@pytest.mark.parametrize("command, prog", [
    ("ddl-report", "ddl-report"), ("ddl-eval import-reference x.pt --variant ddl_dv1", "ddl-eval import-reference"),
    ("ddl-track sync", "ddl-track"), ("ddl-ui", "ddl-ui"), ("ddl-data prepare", "ddl-data"),
    *((f"python -m {module}",) * 2 for module in ("ddl.traffic", "ddl.tune.simulate", "ddl.coord", "ddl.data.bench",
                                                  "ddl.gpu_check", "ddl.bench", "ddl.model.fused.triton_compile"))])
def test_every_command_refuses_an_unknown_flag_in_its_one_error_line(ddl_home, command, prog):
    tool, *args = command.split()
    if tool == "python":
        out = subprocess.run([*python_module(args[1]), "--no-such-flag"], capture_output=True, text=True, timeout=120)
    else:
        out = run_cli(tool, *args, "--no-such-flag", timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == [f"{prog}: error: unrecognized arguments: --no-such-flag"] and not out.stdout
    assert_nothing_created(ddl_home)


@pytest.mark.parametrize("argument, value, message", [
    ("--mb", "nan", "argument --mb: 'nan': must be a finite number > 0"),
    ("--mb", "0", "argument --mb: '0': must be a finite number > 0"),
    ("--workers", "-1", "argument --workers: '-1': must be an integer >= 1"),
    ("--tokenizers", "byte,bogus", "--tokenizers: 'bogus' unknown; allowed: byte, bpe, gpt2"),
    ("--out", "a\nb", "argument --out: 'a\\nb': must be a non-empty path of printable characters")])
def test_the_data_bench_refuses_a_hostile_value_in_one_line_making_nothing(tmp_path, argument, value, message):
    out = tmp_path / "out"
    args = [argument, value] if argument == "--out" else [argument, value, "--out", str(out)]
    done = subprocess.run([*python_module("ddl.data.bench"), *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.splitlines() == [f"python -m ddl.data.bench: error: {message}"]
    assert not out.exists() and list(tmp_path.iterdir()) == []
