"""ddl-run for real: the Hydra app in a subprocess, the submitit local executor, a real MLflow store."""

import os
import socket

import pytest

from tests.conftest import ROOT, assert_two_ranks_trained, mlflow_runs, run_cli

SMOKE = ["model=micro", "train=smoke"]


@pytest.mark.slow
def test_the_users_sweep_runs_three_distinct_jobs_then_skips_them(ddl_home, tmp_path):
    args = ["-m", "residual=ddl,baseline", "dv=1,4", *SMOKE]
    first = run_cli("ddl-run", *args, cwd=tmp_path)                  # not the checkout: configs still found
    assert first.returncode == 0, first.stderr[-3000:]
    assert "4 override sets -> 3 distinct jobs" in first.stdout
    prepared = first.stdout.index("ddl-run: preparing embedded-byte-")          # the data first, then the jobs
    assert "for 3 jobs before they train" in first.stdout and prepared < first.stdout.index("baseline-micro-s0")
    runs = mlflow_runs("default")
    assert sorted(r.info.run_name for r in runs) == ["baseline-micro-s0", "ddl_dv1-micro-s0", "ddl_dv4-micro-s0"]
    from ddl.track import store
    c = store.client()
    artifacts = c.get_experiment_by_name("default").artifact_location
    assert artifacts == (ddl_home / "mlartifacts" / "default").as_uri() and not (tmp_path / "mlruns").exists()
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.params["model.residual"] in ("ddl", "baseline") and run.data.params["train.steps"] == "20"
        assert run.data.tags["ddl.launcher"] == "local" and len(run.data.tags["ddl.signature"]) == 12
        curves = {"train/loss", "val/loss", "val/ppl", "train/lr", "train/grad_norm", "train/tokens_per_s"}
        assert curves <= run.data.metrics.keys()
        assert [m.step for m in c.get_metric_history(run.info.run_id, "val/loss")] == [10, 20]
        assert {a.path for a in c.list_artifacts(run.info.run_id)} == {"config.yaml", "final_metrics.json", "train.log",
                                                                       "checkpoint"}
        [uploaded] = c.list_artifacts(run.info.run_id, "checkpoint")    # the final checkpoint travels with the run
        assert uploaded.path == "checkpoint/model.pt" and run.data.tags["ddl.checkpoint_step"] == "20"
        if run.data.params["model.residual"] == "ddl":
            assert "beta/frac_gt1" in run.data.metrics and "beta/L01.mlp/mean" in run.data.metrics
        else:                                                            # what does not shape a baseline
            assert "model.dv" not in run.data.params and "model.beta_init" not in run.data.params
        assert int(run.data.params["model.params"]) > int(run.data.params["model.ddl_extra_params"]) >= 0
        assert run.data.tags["mlflow.source.git.commit"] == run.data.tags["ddl.git_commit"]
        assert run.data.tags["mlflow.source.name"] == "ddl-run"
        [data] = run.inputs.dataset_inputs
        assert data.dataset.name.startswith("embedded-byte-") and "train_tokens" in data.dataset.profile
        assert any(key.startswith("system/cpu") for key in run.data.metrics)    # MLflow's system metrics
        assert run.data.tags["ddl.checkpoint"].endswith(".pt")
    again = run_cli("ddl-run", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("skipped") >= 3 and "0 finished, 3 skipped, 0 failed" in again.stdout
    assert "preparing" not in again.stdout
    assert len(mlflow_runs("default")) == 3


@pytest.mark.slow
def test_a_job_finished_in_another_experiment_is_reused_with_its_curves_and_evaluated(ddl_home):
    """Same signature, new experiment: no training, but the new run holds the curves of the run that
    trained it and the evaluation asked for; re-run in the first experiment with an evaluation, the
    job reopens that experiment's run and adds it."""
    from ddl.track import store
    assert run_cli("ddl-run", *SMOKE, "experiment=first").returncode == 0
    [first] = mlflow_runs("first")
    evaluate = ["eval=offline", "eval.limit=5"]
    second = run_cli("ddl-run", *SMOKE, "experiment=second", *evaluate)
    assert second.returncode == 0, second.stderr[-3000:]
    [run] = mlflow_runs("second")
    c = store.client()
    assert run.info.status == "FINISHED" and run.data.tags["ddl.history_from"] == first.info.run_id
    curve = [(m.step, m.value) for m in c.get_metric_history(first.info.run_id, "train/loss")]
    assert len(curve) > 1 and [(m.step, m.value) for m in c.get_metric_history(run.info.run_id, "train/loss")] == curve
    assert "eval/0shot/ddl_continuation/reported" in run.data.metrics and "ddl.eval_error" not in run.data.tags
    again = run_cli("ddl-run", *SMOKE, "experiment=first", *evaluate)
    assert again.returncode == 0 and "skipped" not in again.stdout, again.stdout[-3000:]
    [reopened] = mlflow_runs("first")
    assert reopened.info.run_id == first.info.run_id and reopened.info.status == "FINISHED"
    assert "eval/0shot/ddl_continuation/reported" in reopened.data.metrics
    assert "skipped" in run_cli("ddl-run", *SMOKE, "experiment=first", *evaluate).stdout


def test_the_mlflow_logger_writes_every_metric_of_every_step_in_the_background(ddl_home):
    """Batches go to the logger's worker thread (several over the run); close() waits for them, and the
    store, like the run folder's journal, then holds each step's values, in order."""
    from ddl import paths
    from ddl.track import runs, store
    from ddl.track.journal import Journal
    from ddl.track.logger import MLflowLogger
    run_dir = paths.runs_dir() / "sig"
    run = runs.open_run("logger", "sig", "logger", {}, {}, run_dir)
    logger = MLflowLogger(run, max_buffer=50)            # a batch every 25 steps
    for step in range(1, 201):
        logger.log_metrics({"train/loss": 1.0 / step, "train/lr": step * 1e-3}, step)
    logger.close()
    history = store.client().get_metric_history(run.id, "train/loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(s, 1.0 / s) for s in range(1, 201)]
    assert len(store.client().get_metric_history(run.id, "train/lr")) == 200
    journaled = Journal(run_dir).runs()[run.id].points
    assert sorted((step, value) for key, value, _, step in journaled if key == "train/loss") == \
        [(s, 1.0 / s) for s in range(1, 201)]


def test_a_loop_busy_between_logs_is_not_an_outage(ddl_home, monkeypatch):
    """A batch the store answered at once, collected only when the loop comes back from a long validation,
    is no outage: the logger times the store's answer, not the loop's absence."""
    import time

    from ddl import paths
    from ddl.track import logger as logger_module
    from ddl.track import runs
    monkeypatch.setattr(logger_module, "SLOW_S", 3.0)          # the store's answer, even beside a CPU hog
    notes = []
    run = runs.open_run("logger", "sig", "logger", {}, {}, paths.runs_dir() / "sig")
    logger = logger_module.MLflowLogger(run, note=notes.append, flush_s=0.0)
    logger.log_metrics({"train/loss": 1.0}, 1)                   # handed to the worker thread at once
    time.sleep(6.5)                                              # the loop validates for longer than SLOW_S
    logger.log_metrics({"train/loss": 0.5}, 2)                   # collects the first batch, sends the second
    logger.close()
    assert notes == [] and logger.outages == []


@pytest.mark.slow
def test_the_store_follows_ddl_home_and_is_not_exported_to_children(ddl_home, monkeypatch, tmp_path):
    """A job finds its store from DDL_HOME; had the parent exported MLFLOW_TRACKING_URI, a job under
    another DDL_HOME would write to the parent's store, its artifacts to ./mlruns."""
    import os
    from ddl.track import store
    store.experiment_id("first")
    assert "MLFLOW_TRACKING_URI" not in os.environ
    monkeypatch.setenv("DDL_HOME", str(tmp_path / "other"))
    store.experiment_id("second")
    assert store.client().get_experiment_by_name("first") is None
    other = store.client().get_experiment_by_name("second")
    assert other.artifact_location == (tmp_path / "other" / "mlartifacts" / "second").as_uri()


@pytest.mark.slow
def test_a_dry_run_launches_and_writes_nothing(ddl_home):
    out = run_cli("ddl-run", "-m", "+sweep=paper_small", "hydra/launcher=slurm", "--dry-run",      # no cluster to ask
                  env_extra={"COLUMNS": "300"})                                    # (conftest: SLURM_CONF): as asked
    assert out.returncode == 0, out.stderr[-3000:]
    [prepare] = [line for line in out.stdout.splitlines() if "prepare fineweb_edu-gpt2-" in line]   # its data first
    assert "one CPU-only SLURM job, 32 CPUs: about" in prepare and "6 jobs wait on it" in prepare
    assert "6 override sets -> 6 distinct jobs" in out.stdout
    for row in ("baseline-small", "ddl_dv1-small", "ddl_dv4_cc_ec-small"):
        assert row in out.stdout
    assert "GPU-h" in out.stdout and "4.92e+10" in out.stdout                 # 100k x 491,520 tokens
    assert "CPU core-min" not in out.stdout                                   # SLURM jobs get GPUs
    assert not (ddl_home / "mlflow.db").exists() and not (ddl_home / "runs").exists()
    assert not (ddl_home / "eval_tasks").exists()          # lm-eval's task names: the user's cache, any home's


@pytest.mark.slow
def test_the_proxy_study_estimates_cpu_time_within_90_minutes_on_two_cores(ddl_home):
    import re
    out = run_cli("ddl-run", "-m", "+sweep=proxy", "--dry-run", "hydra.launcher.max_parallel=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "18 override sets -> 18 distinct jobs" in out.stdout and "CPU core-min" in out.stdout
    wall = re.search(r"about (\d+) min wall with 2 jobs at once x 1 thread", " ".join(out.stdout.split()))
    assert wall and int(wall.group(1)) <= 90
    assert "Data first, here: python_source-byte-" in " ".join(out.stdout.split())
    assert not (ddl_home / "mlflow.db").exists()


def test_wall_time_schedules_the_longest_jobs_first():
    from ddl.launch.estimate import wall_seconds
    assert wall_seconds([3, 3, 2, 2, 2], slots=2, threads=1) == 7        # {3, 2, 2} and {3, 2}
    assert wall_seconds([10, 1], slots=4, threads=2) == 5


@pytest.mark.slow
def test_a_failing_job_does_not_stop_its_siblings(ddl_home):
    out = run_cli("ddl-run", "-m", *SMOKE, "model.init=gpt2", "model.init_std=0.02,1e15", "experiment=failing")
    assert out.returncode == 1
    assert "1 finished, 0 skipped, 1 failed" in out.stdout and "NonFiniteLoss" in out.stdout
    states = sorted((r.data.params["model.init_std"], r.info.status) for r in mlflow_runs("failing"))
    assert states == [("0.02", "FINISHED"), ("1000000000000000.0", "FAILED")]
    failed = next(r for r in mlflow_runs("failing") if r.info.status == "FAILED")
    assert failed.data.tags["ddl.error"].startswith("NonFiniteLoss: train loss is nan at step 1")


def test_hydra_mode_named_on_the_command_line_still_makes_a_sweep_without_m(ddl_home):
    """The mode comes from -m without composing the config first (cli._mode_from_flags), unless the command names
    hydra.mode: then Hydra composes to read it, and a sweep runs without -m as Hydra allows."""
    out = run_cli("ddl-run", "hydra.mode=MULTIRUN", *SMOKE, "seed=1,2", "--dry-run")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 override sets -> 2 distinct jobs" in out.stdout


def test_a_flag_after_the_overrides_is_one_line_naming_what_it_could_not_take(ddl_home):
    out = run_cli("ddl-run", *SMOKE, "-m", "seed=1,2")
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "ddl-run: error: unrecognized arguments: seed=1,2; flags go before the overrides (key=value): `ddl-run --help` "
        "lists them"], out.stderr
    assert not ddl_home.exists()


@pytest.mark.parametrize("mode", [[], ["-m"]])
@pytest.mark.parametrize("override", ["experiment=a\nb", "seed=[1,2", "experiment=a b("])
def test_an_override_outside_hydras_grammar_is_one_line_naming_it_and_the_grammar(ddl_home, override, mode):
    from ddl.cli import OVERRIDE_GRAMMAR
    out = run_cli("ddl-run", *mode, *SMOKE, override)
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"ddl-run: error: {override!r}: not an override Hydra can parse: key=value, a value with spaces or brackets "
        f"quoted (key='a b'), no control characters; the grammar: {OVERRIDE_GRAMMAR}"], out.stderr
    assert not ddl_home.exists()


def test_a_list_of_values_without_m_says_to_add_it(ddl_home):
    out = run_cli("ddl-run", *SMOKE, "dv=1,4")
    assert out.returncode == 2 and out.stderr.strip() == ("ddl-run: error: dv=1,4: several values make a sweep; "
                                                          "add -m (ddl-run -m dv=1,4)")
    assert not (ddl_home / "runs").exists()


@pytest.mark.slow
def test_an_unavailable_hub_task_keeps_the_training_results(ddl_home, tmp_path):
    out = run_cli("ddl-run", *SMOKE, "eval.tasks=[arc_easy]", "eval.shots=[0]", "experiment=hub",
                  env_extra={"HF_HOME": str(tmp_path / "empty-hf")})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "evaluation skipped: eval.tasks='arc_easy'" in out.stdout
    [run] = mlflow_runs("hub")
    assert run.info.status == "FINISHED" and "final/val/loss" in run.data.metrics
    assert run.data.tags["ddl.eval_error"].endswith("ddl-eval " + run.data.tags["ddl.signature"] + " --tasks arc_easy")


@pytest.mark.parametrize("override, message", [
    ("model=huge", "model=huge: must be one of large, medium, micro, mini, small, tiny"),
    ("dv=0", "dv=0: must be an integer >= 1"),
    ("beta_init=3", "beta_init=3.0: must be a number in [0, 2]"),
    ("dv=2 conv=cc ddl.state_conv_kernel=3", "state_conv_kernel=3: must be <= dv=2 for conv=cc"),
    ("train.steps=-5", "train.steps=-5: must be an integer >= 1"),
    ("dv=abc", "dv='abc': must be an integer"),
    ("train.steps=1.5", "train.steps=1.5: must be an integer"),
    ("train.compile=maybe", "train.compile='maybe': must be true or false"),
    ("ddl=3", "ddl=3: must be a group of keys (beta_estimator, "),
    ("foo=1", "foo: unknown key"),
    ("train.max_steps=100", "train.max_steps: unknown key; did you mean train.steps?"),
    ("lr=3", "lr: unknown key; did you mean train.lr?"),
    ("+model.rope_base=500", "An item is already at 'model.rope_base'. Either remove + prefix: 'model.rope_base=500'"),
    ("residual=sum", "residual='sum': must be one of baseline, ddl"),
    ("data.tokenizer=words", "data.tokenizer='words': must be one of byte, bpe, gpt2"),
    ("data=files", "data.files=None: source=files needs a glob"),
    ("+train.lrr=1", "train.lrr=1: unknown key; did you mean train.lr?"),
    ("+lr=3", "lr=3: unknown key; did you mean train.lr?"),
    ("+model.size_name=x", "model.size_name='x': unknown key; did you mean model.size?"),
    ("eval=offline eval.shots=[one]", "eval.shots[0]='one': must be an integer"),
    ("eval.shots=3", "eval.shots=3: must be a list of integers"),
    ("hydra/launcher=nope", "hydra/launcher=nope: must be one of "),
    ("experiment=", "experiment='': must be a non-empty name"),
    ("--bogus", "unrecognized arguments: --bogus; flags go before the overrides (key=value): `ddl-run --help`"),
])
@pytest.mark.parametrize("mode", [[], ["-m"]])
def test_invalid_overrides_get_one_line_and_no_run(ddl_home, override, message, mode):
    out = run_cli("ddl-run", *mode, *SMOKE, *override.split())
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddl-run: error: ") and message in lines[0], out.stderr
    assert not (ddl_home / "mlflow.db").exists() and not (ddl_home / "runs").exists()


@pytest.mark.slow
def test_a_two_task_local_job_trains_with_ddp_on_gloo(ddl_home):
    out = run_cli("ddl-run", "-m", *SMOKE, "hydra.launcher.tasks_per_node=2", "train.batch_tokens=512",
                  "experiment=ddp")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    [run] = mlflow_runs("ddp")
    assert run.info.status == "FINISHED"
    assert_two_ranks_trained(ddl_home / "sweeps" / "ddp")


@pytest.mark.slow
def test_every_rank_of_a_two_task_job_leaves_a_signature_claimed_after_the_plan(ddl_home, tmp_path):
    """Another process claims the signature between the plan and the job (here: holds it throughout, the job
    submitted with submitit as the launcher submits it): rank 0 leaves it, and rank 1 leaves with rank 0's
    reason from its decision file instead of waiting for rank 0 in the process group until a timeout."""
    import time

    import submitit

    from ddl.launch import job, status
    cfg = _compose([*SMOKE, "train.batch_tokens=512"])
    run_dir = ddl_home / "runs" / job.Job.from_config(cfg).signature
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(tasks_per_node=2, nodes=1, timeout_min=5)
    with status.claim(run_dir):
        submitted = executor.submit(job.run_task, cfg)
        deadline = time.monotonic() + 240                  # rank 1's own wait for a decision is 900 s
        while not submitted.done() and time.monotonic() < deadline:
            time.sleep(1)
        if not submitted.done():
            submitted.cancel()
            pytest.fail("the job's ranks did not leave the claimed signature within 240 s")
        ranks = submitted.results()
    assert [r["status"] for r in ranks] == [status.ELSEWHERE] * 2, ranks
    holder = f"{status.ELSEWHERE}: pid {os.getpid()} on {socket.gethostname()}"
    assert ranks[1]["detail"] == ranks[0]["detail"] == holder
    [decision] = run_dir.glob(f"{status.DECISION}.*")              # decision.<job id>.<attempt>, rank 0's word
    assert decision.read_text() == ranks[0]["detail"] and not mlflow_runs("default")


@pytest.mark.slow
def test_an_installed_wheel_finds_its_configs(tmp_path):
    import os
    import shutil
    import subprocess
    import sys
    import zipfile
    source = tmp_path / "source"     # setuptools builds in the source tree: a copy keeps build/ out of the checkout
    shutil.copytree(ROOT, source,
                    ignore=shutil.ignore_patterns(".*", "build", "reports", "*.egg-info", "__pycache__", "mlruns"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True)
    [wheel] = tmp_path.glob("ddl-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    code = ("import sys; sys.argv = ['ddl-run', '-m', '+sweep=smoke', '--dry-run']; "
            "from ddl.model.fused import native; assert native.SOURCE.is_file(), 'the kernels source is not shipped'; "
            "import ddl.launch.configs as c; print(c.conf_dir()); from ddl.cli import run_main; run_main()")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}:{site_packages}"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(str(tmp_path / "site" / "ddl" / "conf")) and "3 distinct jobs" in out.stdout


def test_a_plan_collapses_jobs_of_one_signature_without_running_anything(ddl_home):
    """The plan is pure (Hydra composes, ddl.launch.plan decides): the user's 4 override sets are 3 jobs."""
    from hydra import compose, initialize_config_dir

    from ddl.launch.configs import conf_dir, register
    from ddl.launch.plan import make_plan

    register()
    sets = [["residual=ddl", "dv=1"], ["residual=ddl", "dv=4"], ["residual=baseline", "dv=1"],
            ["residual=baseline", "dv=4"]]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        plan = make_plan((overrides, compose("config", overrides=overrides)) for overrides in sets)
    assert [j.name for j in plan.jobs] == ["ddl_dv1-tiny-s0", "ddl_dv4-tiny-s0", "baseline-tiny-s0"]
    assert plan.duplicates == {plan.jobs[2].signature: [["residual=baseline", "dv=4"]]}
    assert plan.headline().startswith("4 override sets -> 3 distinct jobs (1 shares a signature")
    assert plan.finished() == {} and not (ddl_home / "runs").exists()


def _compose(overrides, return_hydra_config=False):
    from hydra import compose, initialize_config_dir

    from ddl.launch.configs import conf_dir, register
    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        return compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)


def test_every_field_of_the_config_dataclasses_is_a_key_of_its_group():
    """The schema is read off the dataclasses: a field added to one is a ddl-run key, typed, with its default."""
    import dataclasses

    from ddl.data import DataConfig
    from ddl.eval.config import EvalConfig
    from ddl.launch.schema import AXES, known_keys
    from ddl.model import ModelConfig
    from ddl.train import TrainConfig
    keys = known_keys()
    for group, source in (("data", DataConfig), ("train", TrainConfig), ("eval", EvalConfig)):
        fields = {f.name for f in dataclasses.fields(source)}
        assert {k.split(".")[1] for k in keys if k.startswith(f"{group}.")} == fields
    model_keys = [k.split(".")[-1] for k in keys if k.startswith(("model.", "ddl.")) or k in AXES]
    assert sorted(model_keys) == sorted({f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size"} |
                                        {"size", "head_size"})   # model_config's arguments
    cfg = _compose(["model.rope_base=500", "ddl.beta_hidden=64", "train.beta2=0.99", "eval.limit=3"])
    assert (cfg.model.rope_base, cfg.ddl.beta_hidden, cfg.train.beta2, cfg.eval.limit) == (500.0, 64, 0.99, 3)
    assert cfg.model.init_std == ModelConfig().init_std and cfg.model.n_layer is None   # null: the size's value


def test_hydra_itself_refuses_unknown_keys_and_wrong_types():
    from hydra.errors import ConfigCompositionException
    for override in ("train.lrr=1", "dv=abc", "ddl.k_eps=small", "eval.shots=[one]", "model.size=[1]"):
        with pytest.raises(ConfigCompositionException):
            _compose([override])


@pytest.mark.slow
def test_every_preset_and_named_sweep_composes_under_the_schema(ddl_home):
    """Each conf/<group>/ option and each sweep's defaults merge into the typed schema and make a valid job, and
    leave hydra.mode unset (ddl-run takes the mode from -m without composing to read it: cli._mode_from_flags)."""
    import pickle

    from omegaconf import OmegaConf

    from ddl.launch.compose import task_config
    from ddl.launch.configs import conf_dir, sweeps_dir
    from ddl.launch.spec import Job
    sets = [[f"{group.name}={option.stem}"] for group in conf_dir().iterdir()
            if group.is_dir() and group.name not in ("hydra", "variant") for option in group.glob("*.yaml")]
    sets += [[f"+variant={v.stem}"] for v in (conf_dir() / "variant").glob("*.yaml")]
    sets += [[f"+sweep={s.stem}"] for s in sweeps_dir().glob("*.yaml")]
    assert len(sets) > 20
    for overrides in sets:
        overrides += {"data=files": ["data.files=corpus/*.txt"], "train=paper": ["model=small"]}.get(overrides[0], [])
        cfg = _compose(overrides, return_hydra_config=True)
        assert cfg.hydra.mode is None, overrides
        cfg = task_config(cfg)
        job = Job.from_config(cfg, overrides)
        again = pickle.loads(pickle.dumps(cfg))          # a submitit job gets its config pickled
        assert OmegaConf.get_type(again) is OmegaConf.get_type(cfg)
        assert Job.from_config(again).signature == job.signature
