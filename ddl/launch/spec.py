"""Hydra's composed config -> a validated RunConfig (the edge of the system) and its job row."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from ..data import DataConfig
from ..model import SIZES, ModelConfig, model_config
from ..train import RunConfig, TrainConfig
from .configs import ConfigError


def _plain(node) -> dict:
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if v is not None}


def run_config(cfg: DictConfig) -> RunConfig:
    try:
        data = DataConfig(**_plain(cfg.data))
        model_node = _plain(cfg.model)
        size = model_node.pop("size")
        axes = dict(residual=cfg.residual, dv=cfg.dv, conv=cfg.conv, mapping=cfg.mapping, beta_init=cfg.beta_init)
        model = model_config(size, vocab_size=data.model_vocab_size(), **axes, **_plain(cfg.ddl), **model_node)
        return RunConfig(model, data, TrainConfig(**_plain(cfg.train)), cfg.seed)
    except TypeError as err:  # an unknown field reached a dataclass
        raise ConfigError(str(err).split("__init__() ")[-1]) from None
    except ValueError as err:
        raise ConfigError(str(err)) from None


def row_name(model: ModelConfig) -> str:
    """The paper's row for this model (Baseline, DDL d_v=1, DDL-CC, ...) as an id."""
    if model.residual == "baseline":
        return "baseline"
    name = f"ddl_dv{model.dv}" + ("" if model.conv == "none" else f"_{model.conv}")
    return name + ("_vmap" if model.mapping == "v" else "")


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

    @property
    def signature(self) -> str:
        return self.run.signature()

    @property
    def name(self) -> str:
        return f"{row_name(self.run.model)}-{size_name(self.run.model)}-s{self.run.seed}"

    def params(self) -> dict:
        return {**flatten(self.run.effective_dict()), "model.size": size_name(self.run.model),
                "model.row": row_name(self.run.model)}
