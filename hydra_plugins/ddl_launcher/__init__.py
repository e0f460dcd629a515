"""Hydra instantiates launchers and sweepers only from the hydra_plugins namespace; ddl's logic lives in
ddl.launch.launcher, these two launchers select the submitit executor."""

from ddl.launch import hydra_private
from ddl.launch.launcher import SweepLauncher


class PlannedSweeper(hydra_private.basic_sweeper()):
    """Hydra's basic sweeper without its own composition check of each job: the launcher's plan composes
    and validates every job before anything runs (the same errors, one line each), so it was done twice.
    A searched key makes it run each row's search instead."""

    def validate_batch_is_legal(self, batch) -> None:
        pass

    def sweep(self, arguments):
        """A key on the command line replaces the same key of a named sweep's `hydra.sweeper.params`, a list
        or a range alike (as in Hydra's basic and Optuna sweepers); a searched key (`interval(...)`,
        `choice(...)`) then makes it run each row's search (ddl.launch.tuning); any other sweep is the basic
        sweeper's."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from ddl.launch import tuning
        from ddl.launch.configs import ConfigError
        from ddl.tune.space import split, split_sweep_params
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        self.params, replaced = split_sweep_params(self.params, parser.parse_overrides(arguments))
        if replaced:
            print(f"ddl-run: the command line replaces the sweep's {', '.join(replaced)} (hydra.sweeper.params)",
                  flush=True)
        overrides = parser.parse_overrides([*hydra_private.sweep_overrides(self), *arguments])
        try:
            rows, space = split(overrides)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if not space:
            return super().sweep(arguments)
        return tuning.run(self.launcher, self.split_arguments(rows, None)[0], space)


class LocalSweepLauncher(SweepLauncher):
    _EXECUTOR = "local"


class SlurmSweepLauncher(SweepLauncher):
    _EXECUTOR = "slurm"
