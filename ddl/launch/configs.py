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
    """Named sweeps -> ConfigStore group `sweep` (global package); resolvers `${ddl_home:}` (Hydra's
    dirs) and `${one_task_per_gpu:N}` (SLURM tasks per node: one per GPU, at least one)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from .. import paths

    store = ConfigStore.instance()
    for path in sorted(sweeps_dir().glob("*.yaml")):
        store.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_", provider="ddl")
    if not OmegaConf.has_resolver("ddl_home"):
        OmegaConf.register_new_resolver("ddl_home", lambda: str(paths.home()))
        OmegaConf.register_new_resolver("one_task_per_gpu", lambda gpus: max(1, int(gpus or 0)))
