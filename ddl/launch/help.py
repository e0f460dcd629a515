"""`ddl-run --help`: the page of conf/hydra/help/ddl.yaml's template, its config groups and the config a run
composes. Plain `--help` composes conf/config.yaml's defaults with OmegaConf alone, as Hydra composes them with
no override (the schema, each group's default option under the group's key, then config.yaml's own keys): no
Hydra and no torch, a fifth of Hydra's start-up. With overrides ddl.cli composes with Hydra, for the same page
(tests/test_startup.py compares both compositions).
"""

from __future__ import annotations

import string

from omegaconf import DictConfig, OmegaConf

from .configs import conf_dir, sweeps_dir

HELP_FILE = ("hydra", "help", "ddl.yaml")


def default_config() -> DictConfig:
    """The config of `ddl-run` with no override, less Hydra's node."""
    from .schema import RunSchema
    main = OmegaConf.load(conf_dir() / "config.yaml")
    cfg = OmegaConf.structured(RunSchema)
    for entry in main.defaults:
        if isinstance(entry, str):            # ddl_schema (RunSchema, above) and _self_ (last, below)
            continue
        [(group, option)] = entry.items()
        if not group.startswith("override "):
            cfg = OmegaConf.merge(cfg, {group: OmegaConf.load(conf_dir() / group / f"{option}.yaml")})
    return OmegaConf.merge(cfg, {k: v for k, v in main.items() if k not in ("defaults", "hydra")})


def groups() -> str:
    """A line per config group with its options (conf/<group>/, named sweeps as `sweep`), Hydra's listing."""
    found = {path.name: [p.stem for p in path.glob("*.yaml")] for path in conf_dir().iterdir()
             if path.is_dir() and path.name != "hydra"}
    found["sweep"] = [p.stem for p in sweeps_dir().glob("*.yaml")]
    return "".join(f"{group}: {', '.join(sorted(options))}\n" for group, options in sorted(found.items()) if options)


def page(config: DictConfig, resolve: bool = False) -> str:
    """The help page: the template's header, the groups, the config as YAML, its footer."""
    text = OmegaConf.create({"hydra": {"help": OmegaConf.load(conf_dir().joinpath(*HELP_FILE))}}).hydra.help.template
    return string.Template(text).substitute(APP_CONFIG_GROUPS=groups(),
                                            CONFIG=OmegaConf.to_yaml(config, resolve=resolve))
