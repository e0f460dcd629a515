"""Entry points: ddl-run (Hydra), ddl-data, ddl-eval, ddl-report, ddl-track, ddl-ui (thin dispatchers).

Nothing heavy is imported here, so `ddl-run --help` and dry runs stay fast.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

OVERRIDE_GRAMMAR = "https://hydra.cc/docs/1.2/advanced/override_grammar/basic"
DRY_RUN = re.compile(r"\+{0,2}dry_run=(?i:true|yes|on|1)")    # what `--dry-run` stands for, as a user may write it


def _one_line(err: BaseException, argv: list[str]) -> str:
    """Hydra's composition errors as `key=value: what is allowed`, from what the exceptions carry: the
    missing option and the group's options, the OmegaConf error behind a refused override (its key, value
    and the schema's type), a resolver's own error. Hydra refuses a sweep without -m with text only: the
    override is found by Hydra's own parser. Anything else: Hydra's message, on one line."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    from .launch import schema
    from .validation import shown
    if isinstance(err, OverrideParseException):          # Hydra's parse error spans lines and points at a column
        return (f"{shown(err.override)}: not an override Hydra can parse: key=value, a value with spaces or brackets "
                f"quoted (key='a b'), no control characters; the grammar: {OVERRIDE_GRAMMAR}")
    if isinstance(err, MissingConfigException) and "/" in (err.missing_cfg_file or ""):
        group, option = err.missing_cfg_file.rsplit("/", 1)
        return f"{group}={option}: " + (f"must be one of {', '.join(err.options)}" if err.options else "no such option")
    cause = _origin(err)
    if isinstance(cause, ValidationError):               # a value of the wrong type for its key
        return schema.type_error(cause)
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:   # key=value of no key
        return schema.unknown_key(cause.full_key)
    if isinstance(cause, ValueError) and cause is not err:   # a resolver's one line: ${folder_name:...}
        return str(cause)
    sweep = _sweep_without_m(argv)
    if sweep:
        return f"{sweep}: several values make a sweep; add -m (ddl-run -m {sweep})"
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def _origin(err: BaseException) -> BaseException:
    """What a Hydra error stands for: the end of its __cause__ chain; behind an interpolation's error, the
    resolver's own (OmegaConf keeps it as the __context__)."""
    from omegaconf.errors import InterpolationResolutionError
    while True:
        behind = err.__context__ if isinstance(err, InterpolationResolutionError) else err.__cause__
        if behind is None:
            return err
        err = behind


def _sweep_without_m(argv: list[str]) -> str | None:
    """The first override of several values in a command without -m (Hydra's parsers read argv)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    args = _parser().parse_args(argv)
    if args.multirun:
        return None
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except HydraException:          # an override Hydra cannot parse: its own error is the one to show
        return None
    return next((o.input_line for o in overrides if o.is_sweep_override()), None)


PLAIN_HELP = (["--help"], ["-h"])


def _parser():
    """Hydra's parser of the command line (its flags, then the overrides), refusing in one line, exit 2, where argparse
    would print its usage first."""
    from .launch.hydra_private import args_parser
    parser = args_parser()

    def refuse(message: str):
        if message.startswith("unrecognized arguments"):
            message += "; flags go before the overrides (key=value): `ddl-run --help` lists them"
        parser.exit(2, f"ddl-run: error: {message}\n")
    parser.error = refuse
    return parser


def run_main() -> None:
    from .launch.configs import ConfigError, conf_dir, register

    argv = ["dry_run=true" if a == "--dry-run" else a for a in sys.argv[1:]]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra's errors reach us, to print them as one line
    try:
        # The user's flags and overrides, parsed once (a flag Hydra's parser refuses: one line, before anything is
        # made); None for the plain help page, which imports no Hydra. _for_hydra adds overrides only.
        args = None if argv in PLAIN_HELP else _parser().parse_args(argv)
        with _for_hydra(argv) as hydra_argv:
            sys.argv = [sys.argv[0], *hydra_argv]
            if not _print_help(str(conf_dir()), args):
                register()
                with _mode_from_flags(args):
                    _hydra_app(str(conf_dir()))()
    except ConfigError as err:
        print(f"ddl-run: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("ddl-run: stopped by SIGINT (its run, if one was opened, is KILLED); run the same command to resume "
              "from the last checkpoint", file=sys.stderr)
        sys.exit(130)
    except Exception as err:
        from hydra.errors import HydraException         # imported here: `ddl-run --help` imports no Hydra
        from omegaconf.errors import OmegaConfBaseException
        if isinstance(err, (HydraException, OmegaConfBaseException)):
            print(f"ddl-run: error: {_one_line(err, argv)}", file=sys.stderr)
            sys.exit(2)
        from .launch.launcher import SweepFailed, SweepInterrupted
        from .train import Interrupted
        if isinstance(err, SweepFailed):
            print(f"ddl-run: {err}", file=sys.stderr)
            sys.exit(1)
        if isinstance(err, SweepInterrupted):
            print(f"ddl-run: {err}", file=sys.stderr)
            sys.exit(128 + err.signum)
        if isinstance(err, Interrupted):
            print(f"ddl-run: {err}; the run is KILLED: run the same command to resume", file=sys.stderr)
            sys.exit(128 + err.signum)
        from .track.logger import StoreUnreachable
        if isinstance(err, StoreUnreachable):
            print(f"ddl-run: error: {err}", file=sys.stderr)
            sys.exit(1)
        if isinstance(err, OSError):    # a full disk, a read-only DDL_HOME: the environment, not the code
            where = f"{err.filename}: " if err.filename else ""
            print(f"ddl-run: error: {where}{err.strerror or err}", file=sys.stderr)
            sys.exit(1)
        raise


@contextlib.contextmanager
def _for_hydra(argv: list[str]):
    """The command line Hydra gets. A dry run writes nothing where the user works: Hydra writes a run's
    .hydra/ and log, and a sweep's multirun.yaml, before any of ddl's code runs, so for a dry run its
    output folders are a temporary folder, removed at the end (DDL_HOME and the working directory may be
    read-only); and it takes none of Hydra's logging configs (their log file and handlers are an eighth
    of composing each job), unless the command names one."""
    if not any(DRY_RUN.fullmatch(arg) for arg in argv):
        yield argv
        return
    import tempfile
    named = {arg.partition("=")[0] for arg in argv}
    quiet = [f"{group}=none" for group in ("hydra/job_logging", "hydra/hydra_logging") if group not in named]
    with tempfile.TemporaryDirectory(prefix="ddl-dry-run-") as scratch:
        yield [*argv, f"hydra.run.dir='{scratch}'", f"hydra.sweep.dir='{scratch}'", *quiet]


MODE_KEYS = frozenset({"hydra", "hydra.mode", "hydra.searchpath"})   # can set hydra.mode: the key, its node, configs


def _mode_from_flags(args):
    """Hydra's mode from -m alone (hydra_private.mode_from_flags), without composing the config to read hydra.mode
    first, where only ddl's own configs are composed (none sets the key: tests/test_launch.py) and the command line
    (args, parsed) names neither the key nor another config search path."""
    from .launch.hydra_private import mode_from_flags
    keys = {line.partition("=")[0].lstrip("~+") for line in args.overrides}
    if args.config_dir or args.config_path or args.config_name or keys & MODE_KEYS:
        return contextlib.nullcontext()
    return mode_from_flags()


def _print_help(config_dir: str, args) -> bool:
    """`ddl-run --help` (where no other config is named): the page of ddl.launch.help. Plain `--help` (args None)
    needs neither Hydra nor torch; with overrides (`ddl-run model=small --help`) Hydra composes the config shown.
    Hydra's own --help copies its whole config repository for each of the ~80 lookups it makes to list the
    groups (0.6 s of its 0.9 s)."""
    from .launch import help
    from .launch.configs import register
    if args is None:
        print(help.page(help.default_config()))
        return True
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .launch.hydra_private import main_hydra
    if not args.help or args.config_name or args.config_path or args.config_dir:
        return False
    register()
    hydra = main_hydra(config_dir)
    cfg = hydra.compose_config("config", args.overrides, run_mode=RunMode.RUN)
    HydraConfig.instance().set_config(cfg)
    print(help.page(hydra.get_sanitized_cfg(cfg, "job"), resolve=args.resolve))
    return True


def _hydra_app(config_path: str):
    import hydra

    from .launch.configs import ConfigError

    @hydra.main(config_path=config_path, config_name="config", version_base="1.3")
    def app(cfg):
        try:
            return _run_one(cfg)
        except ConfigError as err:  # exit here: Hydra would log a second line for an exception
            _leave_nothing()
            print(f"ddl-run: error: {err}", file=sys.stderr)
            sys.exit(2)

    return app


def _leave_nothing() -> None:
    """A refused run leaves nothing, as a dry run does: Hydra wrote the run's .hydra/ and log before ddl's
    checks ran, so they go, with each folder of DDL_HOME left empty (`paths.prune`). A sweep's job keeps
    its folder: the sweep's logs are there."""
    import logging
    import shutil
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from . import paths
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.RUN:
        return
    folder = Path(hydra.runtime.output_dir)
    if hydra.output_subdir is not None:
        shutil.rmtree(folder / hydra.output_subdir, ignore_errors=True)
    root = logging.getLogger()
    for handler in list(root.handlers):     # Hydra's job log (a closed FileHandler would open it again)
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == folder:
            root.removeHandler(handler)
            handler.close()
            Path(handler.baseFilename).unlink(missing_ok=True)
    paths.prune(folder)


def _run_one(cfg):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from .launch.job import run_task
    from .launch.spec import check_single_run
    hydra = HydraConfig.get()
    check_single_run(cfg, list(hydra.overrides.task),
                     list(hydra.overrides.hydra) if hydra.mode == RunMode.RUN else [])   # a sweep's job: launched
    if cfg.dry_run:
        import shutil
        from .launch.spec import Job
        from .launch.table import job_table
        gpus = int(shutil.which("nvidia-smi") is not None)   # train.device=auto takes a GPU where there is one
        job_table([Job.from_config(cfg)], gpus, slots=1, threads=len(os.sched_getaffinity(0))).print()
        return None
    return run_task(cfg)


def _dispatch(module: str) -> None:
    import importlib
    sys.exit(importlib.import_module(module).main(sys.argv[1:]))


def data_main() -> None:
    _dispatch("ddl.data.cli")


def eval_main() -> None:
    if sys.argv[1:2] == ["import-reference"]:
        del sys.argv[1]
        _dispatch("ddl.launch.reference_import")
    else:
        _dispatch("ddl.eval.cli")


def report_main() -> None:
    _dispatch("ddl.report.cli")


def track_main() -> None:
    _dispatch("ddl.track.sync")


def ui_main() -> None:
    _dispatch("ddl.track.ui")
