"""A sweep's job configs as Hydra composes them, each distinct choice of config groups composed once.

Hydra composes a job in two steps (ConfigLoaderImpl._load_configuration_impl): the defaults list, from
the overrides that name config groups (`model=micro`, `+variant=ddl_dv4`), merged into one config;
then every other override (`seed=3`, `train.lr=1e-3`) applied to it in order. The first step is
nearly all of the cost and reads none of the second step's overrides, so `JobConfigs` runs it once per
distinct set of group overrides (its `base`) and gives each job a copy with its own value overrides
applied by Hydra's parser and Hydra's function. An override of Hydra's own node (`hydra.searchpath`
changes where groups are found) counts as a group override. Where the shortcut raises, the job's full
composition decides: its config, or Hydra's own error for the refusal's one line. The functions are
Hydra 1.3's internals: tests/test_plan_compose.py compares every named sweep's jobs with Hydra's own
composition of each, so a Hydra that changes them fails there.
"""

from __future__ import annotations

import copy

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from . import hydra_private
from .hydra_private import ConfigLoaderImpl


def task_config(cfg: DictConfig) -> DictConfig:
    """A composed config less Hydra's node, as Hydra's run_job gives it to the task (and to the plan)."""
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


class JobConfigs:
    """override set -> its job's config (less Hydra's node), equal to Hydra's composition of it."""

    def __init__(self, loader: ConfigLoaderImpl, master: DictConfig):
        self.loader, self.master = loader, master
        hydra_overrides = OmegaConf.to_container(master.hydra.overrides.hydra)
        # the repository Hydra composes from: its search path with any hydra.searchpath of the command line
        self.repo = hydra_private.caching_repo(loader, master.hydra.job.config_name, hydra_overrides)
        self.parser = OverridesParser.create()
        self.parsed: dict[str, tuple[Override, bool]] = {}   # override -> (Hydra's parse, whether it is a value)
        self.bases: dict[tuple[str, ...], DictConfig] = {}   # group overrides -> their composition

    def __call__(self, overrides: list[str]) -> DictConfig:
        try:
            return self.fast(overrides)
        except (HydraException, OmegaConfBaseException, ValueError):
            return self.full(overrides)

    def fast(self, overrides: list[str]) -> DictConfig:
        """A copy of the composition of the job's group overrides, with its other overrides applied."""
        parsed = [self._parse(line) for line in overrides]
        cfg = copy.deepcopy(self._base(tuple(override.input_line for override, value in parsed if not value)))
        hydra_private.apply_overrides([override for override, value in parsed if value], cfg)
        return cfg

    def full(self, overrides: list[str]) -> DictConfig:
        """Hydra's composition of the whole override set."""
        return task_config(self.loader.load_sweep_config(self.master, list(overrides)))

    def _base(self, groups: tuple[str, ...]) -> DictConfig:
        if groups not in self.bases:
            self.bases[groups] = self.full(list(groups))
        return self.bases[groups]

    def _parse(self, line: str) -> tuple[Override, bool]:
        """Hydra's parse of one override, and whether Hydra applies it as a value (not a group's choice,
        not a sweep, not of Hydra's node): Hydra's own sort (defaults_list.Overrides)."""
        if line not in self.parsed:
            [override] = self.parser.parse_overrides([line])
            value = not (override.is_sweep_override() or override.is_hydra_override()) \
                and hydra_private.is_config_override(self.repo, override)
            self.parsed[line] = override, value
        return self.parsed[line]
