"""Where ddl-run's configs live, found from any directory and from an installed wheel.

A checkout has them at the top level (conf/, sweeps/); a wheel ships the same directories
as the data packages `ddl.conf` and `ddl.sweeps` (pyproject's package-dir mapping).
Named sweeps become the Hydra group `sweep` (`+sweep=<file name>`), registered from sweeps/.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


class ConfigError(ValueError):
    """An invalid override: one line naming the key, the value and what is allowed."""


def env_seconds(name: str, default: float) -> float:
    """validation.env_seconds, its one line a ConfigError (a refused sweep leaves nothing)."""
    from ..validation import env_seconds as seconds
    try:
        return seconds(name, default)
    except ValueError as err:
        raise ConfigError(str(err)) from None


_CHECKOUT = Path(__file__).resolve().parent.parent.parent


def _find(name: str) -> Path:
    if (_CHECKOUT / name / ("config.yaml" if name == "conf" else "smoke.yaml")).is_file():
        return _CHECKOUT / name
    spec = importlib.util.find_spec(f"ddl.{name}")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"ddl: cannot find its {name}/ directory (broken install?)")
    return Path(list(spec.submodule_search_locations)[0])


def conf_dir() -> Path:
    return _find("conf")


def sweeps_dir() -> Path:
    return _find("sweeps")


def register() -> None:
    """ddl-run's schema -> ConfigStore `ddl_schema` (ddl.launch.schema; config.yaml's first default); named
    sweeps -> group `sweep` (global package); resolvers `${ddl_home:}` (Hydra's
    dirs), `${folder_name:NAME}` (the experiment checked before Hydra makes a folder of it) and
    `${one_task_per_gpu:N}` (SLURM tasks per node: one per GPU, at least one)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from .. import paths
    from ..validation import safe_name
    from .schema import RunSchema

    store = ConfigStore.instance()
    store.store(name="ddl_schema", node=RunSchema, provider="ddl")
    for path in sorted(sweeps_dir().glob("*.yaml")):
        store.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_", provider="ddl")
    for name, schema in launcher_schemas().items():
        store.store(group="hydra/launcher", name=name, node=schema, provider="ddl")
    if not OmegaConf.has_resolver("ddl_home"):
        OmegaConf.register_new_resolver("ddl_home", lambda: str(paths.home()))
        OmegaConf.register_new_resolver("one_task_per_gpu", lambda gpus: max(1, int(gpus or 0)))
        OmegaConf.register_new_resolver("folder_name", lambda name: safe_name("experiment", name))


def launcher_schemas() -> dict[str, type]:
    """hydra-submitit-launcher's queue configs with ddl's launcher as target and the fields ddl adds:
    max_parallel (how many jobs run at once; null: CPUs // cpus_per_task locally, all on SLURM), locally
    warm_start (jobs forked from a process that imported torch and MLflow once: ddl.launch.warm) and,
    on SLURM, srun_args (submitit's, for srun), gpu_memory_gib (each GPU's memory, against which the plan
    checks a job's estimate) and the prepare job's own settings (ddl.launch.data_jobs: its partition, null
    for the jobs'; CPUs; memory; time). conf/hydra/launcher/{local,slurm}.yaml extend these and set only
    what ddl changes."""
    from dataclasses import field, make_dataclass
    from typing import List, Optional

    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

    def extend(base: type, launcher: str, *extra: tuple) -> type:
        fields = [("_target_", str, field(default=f"hydra_plugins.ddl_launcher.{launcher}")),
                  ("max_parallel", Optional[int], field(default=None)), *extra]
        return make_dataclass(f"DDL{base.__name__}", fields, bases=(base,))
    return {"ddl_local_base": extend(LocalQueueConf, "LocalSweepLauncher", ("warm_start", bool, field(default=True))),
            "ddl_slurm_base": extend(SlurmQueueConf, "SlurmSweepLauncher",
                                     ("srun_args", Optional[List[str]], field(default=None)),
                                     ("gpu_memory_gib", float, field(default=80.0)),
                                     ("prepare_partition", Optional[str], field(default=None)),
                                     ("prepare_cpus_per_task", int, field(default=32)),
                                     ("prepare_mem_gb", Optional[int], field(default=64)),
                                     ("prepare_timeout_min", int, field(default=1440)))}
