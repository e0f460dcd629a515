"""A sweep's plan composes once per choice of config groups and applies the other overrides to a copy
(ddl.launch.compose): a job's config, bit for bit, and its plan, signatures included, against Hydra's
composition of the job: every job of a product of variants, sizes, seeds and values, and on every named
sweep each job that brings a swept value or a choice of config groups no earlier job had (Hydra's
composition, ~0.25 s a job, of all 600-odd named jobs was the suite's costliest minutes)."""

import contextlib
import pickle

import pytest

from ddl.launch.configs import sweeps_dir
from tests.conftest import run_cli, slow_except

# The seed study at 48 jobs, with values of each kind the grammar has: a number in e notation,
# null, a quoted string, a list, a key of a group's node beside its choice
PRODUCT = ["+variant=baseline,ddl_dv1,ddl_dv4,ddl_dv4_ec", "seed=range(0,3)", "model=micro,tiny",
           "train.lr=3e-4", "model.n_layer=null,3", "train.tokens_per_param=null", "experiment='seeds'",
           "eval.shots=[0,1]"]
SWEEPS = {path.stem: [f"+sweep={path.stem}"] for path in sorted(sweeps_dir().glob("*.yaml"))}


@contextlib.contextmanager
def _multirun(args: list[str]):
    """What Hydra's multirun builds for `ddl-run -m ARGS --dry-run`: the sweeper with ddl's launcher, and the
    override sets it hands the launcher; a search's: its rows and each row at each end of each range, as
    ddl.launch.tuning plans them."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext, RunMode

    from ddl.launch.configs import conf_dir, register
    from ddl.launch.hydra_private import callbacks, sweep_overrides
    from ddl.tune.space import split
    register()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):   # ddl-run's hydra.main
        hydra = GlobalHydra.instance().hydra
        master = hydra.compose_config("config", [*args, "dry_run=true"], run_mode=RunMode.MULTIRUN)
        sweeper = Plugins.instance().instantiate_sweeper(
            config=master, hydra_context=HydraContext(hydra.config_loader, callbacks(master)), task_function=print)
        parser = OverridesParser.create(config_loader=hydra.config_loader)
        rows, space = split(parser.parse_overrides([*sweep_overrides(sweeper), *master.hydra.overrides.task]))
        [sets] = sweeper.split_arguments(rows, None)
        yield sweeper.launcher, sets + [[*row, end] for row in sets for dim in space for end in dim.ends()]


def _covering(sets: list[list[str]]) -> list[list[str]]:
    """The override sets that bring an override, or a choice of config groups (keys without a dot), that no
    earlier set had."""
    seen, kept = set(), []
    for overrides in sets:
        new = {*overrides, tuple(o for o in overrides if "." not in o.split("=")[0])} - seen
        if new:
            kept.append(overrides)
            seen |= new
    return kept


@pytest.mark.parametrize("args", slow_except({**SWEEPS, "product": PRODUCT}, "smoke", "tuned"))
def test_the_plan_composes_each_value_and_choice_of_groups_as_hydra_does(ddl_home, args):
    from hydra.core.utils import filter_overrides

    from ddl.launch.plan import make_plan
    with _multirun(args) as (launcher, sets):
        configs = launcher.job_configs()                              # the plan's own, its bases composed here
        for overrides in sets:                                        # every job composes
            configs.fast(overrides)
        sets = sets if args == PRODUCT else _covering(sets)
        ours = [configs.fast(overrides) for overrides in sets]       # all first: none may change another
        hydras = [configs.full(overrides) for overrides in sets]
        for overrides, mine, theirs in zip(sets, ours, hydras, strict=True):
            assert pickle.dumps(mine) == pickle.dumps(theirs), overrides
        planned = launcher.plan(sets)
    assert planned == make_plan((list(filter_overrides(o)), cfg) for o, cfg in zip(sets, hydras, strict=True))
    assert len(planned.jobs) > 1 and all(job.signature for job in planned.jobs)


def test_the_product_composes_once_per_variant_and_size(ddl_home):
    with _multirun(PRODUCT) as (launcher, sets):
        configs = launcher.job_configs()
        for overrides in sets:
            configs.fast(overrides)
        launcher.plan(sets)                                           # a search's later rounds: no base again
    assert len(sets) == 48 and len(configs.bases) == 8 and launcher.job_configs() is configs


@pytest.mark.parametrize("sweep, message", [
    ("dv=1,abc", "dv='abc': must be an integer"),
    ("train.steps=20,-5", "train.steps=-5: must be an integer >= 1  [in job: train.steps=-5 model=micro train=smoke"),
    ("model.n_layer=2,[3]", "model.n_layer=[3]: must be an integer or null"),
])
def test_a_bad_value_in_a_sweep_is_one_line_and_writes_nothing(ddl_home, sweep, message):
    for dry_run in ([], ["--dry-run"]):
        out = run_cli("ddl-run", "-m", sweep, "model=micro", "train=smoke", *dry_run)
        assert out.returncode == 2 and out.stderr.startswith(f"ddl-run: error: {message}"), out
        assert len(out.stderr.splitlines()) == 1 and not any(ddl_home.rglob("*")), out.stderr
