"""Every private name of Hydra the project uses (its `_internal` package, private methods), and nothing else: an
upgrade that moves one breaks this module alone, and tests/test_private_apis.py says which name and which Hydra
version. Import it only where Hydra is wanted (it imports Hydra's config loader)."""

from __future__ import annotations

import contextlib

from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.defaults_list import Overrides
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path, get_args_parser

CHECKED_WITH = "1.3.8"

__all__ = ["basic_sweeper", "ConfigLoaderImpl", "CHECKED_WITH", "args_parser", "main_hydra", "callbacks",
           "caching_repo", "is_config_override", "apply_overrides", "sweep_overrides", "job_exception",
           "mode_from_flags"]


def args_parser():
    """The argparse parser of a Hydra app's command line (-m, --cfg, --help, overrides)."""
    return get_args_parser()


def main_hydra(config_dir: str, task_name: str = "cli") -> Hydra:
    """The Hydra a `@hydra.main` app builds over config_dir, to compose a config or print its help page."""
    return Hydra.create_main_hydra2(task_name=task_name, config_search_path=create_config_search_path(config_dir))


@contextlib.contextmanager
def mode_from_flags():
    """While it lasts, Hydra's `_run_hydra` takes the mode (run or multirun) from -m alone, as it does when the
    config leaves `hydra.mode` unset: its probe (Hydra.get_mode) composes the whole config once only to read that key
    before composing it again to run, a quarter of a short run's start-up. For configs that never set the key."""
    probe = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = probe


def callbacks(cfg) -> Callbacks:
    """Hydra's callbacks of a composed config, as its multirun hands them to the sweeper."""
    return Callbacks(cfg)


def caching_repo(loader: ConfigLoaderImpl, config_name: str, hydra_overrides: list[str]):
    """The config repository Hydra composes from: its search path with any hydra.searchpath of the command line."""
    return loader._parse_overrides_and_create_caching_repo(config_name, hydra_overrides)[1]


def is_config_override(repo, override) -> bool:
    """Whether Hydra applies a parsed override as a value of the config (not a group's choice)."""
    return bool(Overrides(repo, [override]).config_overrides)


def apply_overrides(overrides: list, cfg) -> None:
    """Hydra's application of parsed value overrides to a composed config, in place."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def basic_sweeper() -> type:
    """Hydra's basic sweeper class as its module holds it now: Hydra's plugin scan runs that module again, and a
    class bound before the scan is not the one its methods name."""
    from hydra._internal.core_plugins import basic_sweeper as module
    return module.BasicSweeper


def sweep_overrides(sweeper) -> list[str]:
    """The basic sweeper's `hydra.sweeper.params`, as override lines."""
    return sweeper._parse_config()


def job_exception(result) -> BaseException:
    """The exception a FAILED JobReturn holds (its public return_value raises it, printing a line first)."""
    return result._return_value
