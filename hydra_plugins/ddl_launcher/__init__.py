"""Hydra instantiates launchers and sweepers only from the hydra_plugins namespace; ddl's logic lives in
ddl.launch.launcher, these two launchers select the submitit executor."""

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

from ddl.launch.launcher import SweepLauncher


class PlannedSweeper(BasicSweeper):
    """Hydra's basic sweeper without its own composition check of each job: the launcher's plan composes
    and validates every job before anything runs (the same errors, one line each), so it was done twice."""

    def validate_batch_is_legal(self, batch) -> None:
        pass


class LocalSweepLauncher(SweepLauncher):
    _EXECUTOR = "local"


class SlurmSweepLauncher(SweepLauncher):
    _EXECUTOR = "slurm"
