"""Hydra's composed config -> a validated RunConfig (the edge of the system) and its job row."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from ..data import DataConfig
from ..data.config import VAL_FRACTION as HELD_OUT
from ..eval.config import EvalConfig
from ..eval.suites import OFFLINE_TASK
from ..model import SIZES, ModelConfig, ddl_extra_params, model_config, param_count
from ..model.config import DDL_KNOBS
from ..train import RunConfig, TrainConfig
from ..tune.config import TuneConfig
from ..validation import is_finite, safe_name
from .configs import ConfigError
from .schema import AXES, undeclared, unknown_key


def _group(cfg: DictConfig, group: str) -> dict:
    """The group's values but nulls (a null takes the dataclass's default, or the size's); one line for a
    required value left unset (???)."""
    try:
        values = OmegaConf.to_container(cfg[group], resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key}=???: needs a value (see conf/{group}/)") from None
    return {k: v for k, v in values.items() if v is not None}


def run_config(cfg: DictConfig) -> RunConfig:
    """The composed config (keys and types already Hydra's, through ddl.launch.schema) -> the RunConfig its
    dataclasses validate."""
    added = undeclared(cfg)
    if added:
        raise ConfigError(unknown_key(added, OmegaConf.select(cfg, added)))
    try:
        data = DataConfig(**_group(cfg, "data"))
        model_node = _group(cfg, "model")
        axes = {axis: cfg[axis] for axis in AXES}
        model = model_config(model_node.pop("size"), vocab_size=data.model_vocab_size(), **axes,
                             **_group(cfg, "ddl"), **model_node)
        return RunConfig(model, data, TrainConfig(**_group(cfg, "train")), cfg.seed, cfg.replica)
    except (TypeError, ValueError) as err:  # TypeError: a value of the wrong kind reached a check
        raise ConfigError(str(err)) from None


def eval_config(cfg: DictConfig) -> EvalConfig:
    from ..eval.harness import check_tasks
    try:
        evaluation = EvalConfig(**_group(cfg, "eval"))
        check_tasks(evaluation.tasks)
        return evaluation
    except ValueError as err:
        raise ConfigError(str(err)) from None


def tune_config(cfg: DictConfig) -> TuneConfig:
    try:
        return TuneConfig(**_group(cfg, "tune"))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def power_goal(cfg: DictConfig) -> tuple[float | None, float | None]:
    """(detect, seed_sd): the gap a sweep is sized for, a share of the baseline's loss, and a seed's sd in nats."""
    detect, seed_sd = cfg.get("detect"), cfg.get("seed_sd")
    if detect is not None and not (is_finite(detect) and 0 < detect < 1):
        raise ConfigError(f"detect={detect!r}: must be a share of the baseline's loss in (0, 1), e.g. 0.0066 "
                          f"(the paper's d_v=4 gain at small)")
    if seed_sd is not None and not (is_finite(seed_sd) and seed_sd > 0):
        raise ConfigError(f"seed_sd={seed_sd!r}: must be a number of nats > 0 (a seed's sd of the final loss)")
    return detect, seed_sd


def _given(overrides: list[str]) -> dict[str, str]:
    """key -> value of the overrides the user gave (`+key=v`, `~key` alike)."""
    return {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[-1] for o in overrides}


def check_warmup(cfg: DictConfig, overrides: list[str]) -> None:
    """Warmup steps given beside a warmup share is one line: the share sets the warmup, the steps would be ignored."""
    given, frac = _given(overrides), OmegaConf.select(cfg, "train.warmup_frac")
    if "train.warmup_steps" in given and frac is not None:
        raise ConfigError(f"train.warmup_steps={given['train.warmup_steps']}: train.warmup_frac={frac} sets the "
                          f"warmup (round({frac} * train.steps)); give one: train.warmup_frac=null to set the steps")


def check_single_run(cfg: DictConfig, overrides: list[str], hydra_overrides: list[str] = ()) -> None:
    """A run without -m: its warmup (check_warmup); a search's setting (tune.*) on a run no search launched, or a
    launcher's (it trains in this process, through no launcher), is one line (it would be ignored)."""
    from ..tune.space import PLAIN_TUNE_KEYS, unsearched_line
    check_warmup(cfg, overrides)
    launcher = next((line for line in hydra_overrides if line.startswith(("hydra.launcher.", "hydra/launcher="))), None)
    if launcher is not None:
        raise ConfigError(f"{launcher}: a launcher's setting, which a run without -m ignores (it trains in this "
                          f"process); add -m to launch it through the launcher")
    given = _given(overrides)
    unsearched = [k for k in given if k.startswith("tune.") and k not in PLAIN_TUNE_KEYS]
    if unsearched and not OmegaConf.select(cfg, "tune.role"):
        raise ConfigError(unsearched_line(unsearched[0], given[unsearched[0]]))


def experiment_name(cfg: DictConfig) -> str:
    """The MLflow experiment (also a directory name under reports/ and mlartifacts/)."""
    return valid_experiment(cfg.experiment)


def valid_experiment(name) -> str:
    try:
        return safe_name("experiment", name)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def row_name(model: ModelConfig) -> str:
    """The paper's row for this model (Baseline, DDL d_v=1, DDL-CC, ...) as an id."""
    if model.residual == "baseline":
        return "baseline"
    name = f"ddl_dv{model.dv}" + ("" if model.conv == "none" else f"_{model.conv}")
    return name + ("_vmap" if model.mapping == "v" else "") + (f"_nh{model.n_h}" if model.n_h > 1 else "")


def size_name(model: ModelConfig) -> str:
    dims = dict(n_layer=model.n_layer, n_head=model.n_head, d_model=model.d_model)
    return next((name for name, size in SIZES.items() if all(size[k] == v for k, v in dims.items())),
                f"L{model.n_layer}-d{model.d_model}")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass
class Job:
    """One distinct job of a sweep."""
    overrides: list[str]
    run: RunConfig
    experiment: str
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    label: str = ""     # the settings that tell it from the sweep's other jobs of its row (plan.label_jobs)
    tuning: TuneConfig = field(default_factory=TuneConfig)    # a search's settings, and its trial's identity
    searched: dict = field(default_factory=dict)              # a search's job: its searched keys' values
    detect: float | None = None       # the sweep's goal: a gap to resolve, a share of the baseline's loss
    seed_sd: float | None = None      # ... and a seed's sd (nats), where the store has none (ddl.launch.power)

    @classmethod
    def from_config(cls, cfg: DictConfig, overrides: list[str] = ()) -> "Job":
        """The validated job of one composed config: every error is one ConfigError line."""
        check_warmup(cfg, overrides)
        tuning = tune_config(cfg)
        detect, seed_sd = power_goal(cfg)
        job = cls(list(overrides), run_config(cfg), experiment_name(cfg), eval_config(cfg), tuning=tuning,
                  searched={key: OmegaConf.select(cfg, key) for key in tuning.keys}, detect=detect, seed_sd=seed_sd)
        data = job.run.data
        if OFFLINE_TASK in job.evaluation.tasks and data.source == "embedded" and data.val_fraction < HELD_OUT:
            raise ConfigError(f"data.val_fraction={data.val_fraction}: must be >= {HELD_OUT} with eval task "
                              f"{OFFLINE_TASK}, whose items come from that held-out share "
                              f"(else the run trains on them)")
        return job

    @property
    def signature(self) -> str:
        return self.run.signature()

    @property
    def base_name(self) -> str:
        return f"{row_name(self.run.model)}-{size_name(self.run.model)}-s{self.run.seed}"

    @property
    def name(self) -> str:
        """The run's name: its row, size and seed, then the settings of its label (`ddl_dv1-tiny-s0 beta_init=0.5`)."""
        return f"{self.base_name} {self.label}" if self.label else self.base_name

    def params(self) -> dict:
        return run_params(self.run)


def run_params(run: RunConfig) -> dict:
    """MLflow's params of a run: what shapes it (a baseline logs no Delta knob), its parameterization (and
    µP's base width), size, row and parameter counts (total and what the Delta residual adds). A trained
    job's and an imported checkpoint's."""
    model = run.model
    params = flatten(run.effective_dict())
    if model.residual == "baseline":
        params = {k: v for k, v in params.items() if k.removeprefix("model.") not in DDL_KNOBS}
    base_width = {"model.mup_base_width": model.mup_base_width} if model.param == "mup" else {}
    return {**params, "model.param": model.param, **base_width, "model.size": size_name(model),
            "model.row": row_name(model), "model.params": param_count(model),
            "model.ddl_extra_params": ddl_extra_params(model)}
