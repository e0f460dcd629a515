"""Hydra instantiates launchers only from the hydra_plugins namespace; ddl's logic lives in
ddl.launch.launcher, these two names select the submitit executor."""

from ddl.launch.launcher import SweepLauncher


class LocalSweepLauncher(SweepLauncher):
    _EXECUTOR = "local"


class SlurmSweepLauncher(SweepLauncher):
    _EXECUTOR = "slurm"
