"""Entry points: ddl-run (Hydra), ddl-data, ddl-eval, ddl-report, ddl-ui (thin dispatchers).

Nothing heavy is imported here, so `ddl-run --help` and dry runs stay fast.
"""

from __future__ import annotations

import os
import re
import sys


def _one_line(err: BaseException) -> str:
    """Hydra's multi-line composition errors, condensed to `key=value: what is allowed`."""
    text = str(err)
    missing = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        allowed = f"must be one of {', '.join(options)}" if options else "no such option"
        return f"{group.split('/')[-1]}={option}: {allowed}"
    resolver = re.search(r"raised while resolving interpolation: (.+)", text)   # ${folder_name:...}
    if resolver:
        return resolver.group(1).strip()
    override = re.search(r"Could not override '([^']+)'", text)
    if override:
        from .launch.spec import unknown_key
        return unknown_key(override.group(1))
    ambiguous = re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", text)
    if ambiguous:
        key, values = ambiguous.groups()
        return f"{key}={values}: several values make a sweep; add -m (ddl-run -m {key}={values})"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(err).__name__)
    return first


def run_main() -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .launch.configs import ConfigError, conf_dir, register

    argv = ["dry_run=true" if a == "--dry-run" else a for a in sys.argv[1:]]
    sys.argv = [sys.argv[0], *argv]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra's errors reach us, to print them as one line
    register()
    try:
        _hydra_app(str(conf_dir()))()
    except ConfigError as err:
        print(f"ddl-run: error: {err}", file=sys.stderr)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as err:
        print(f"ddl-run: error: {_one_line(err)}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("ddl-run: stopped by SIGINT (its run, if one was opened, is KILLED); run the same command to resume "
              "from the last checkpoint", file=sys.stderr)
        sys.exit(130)
    except Exception as err:
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
        if isinstance(err, OSError):    # a full disk, a read-only DDL_HOME: the environment, not the code
            where = f"{err.filename}: " if err.filename else ""
            print(f"ddl-run: error: {where}{err.strerror or err}", file=sys.stderr)
            sys.exit(1)
        raise


def _hydra_app(config_path: str):
    import hydra

    from .launch.configs import ConfigError

    @hydra.main(config_path=config_path, config_name="config", version_base="1.3")
    def app(cfg):
        try:
            return _run_one(cfg)
        except ConfigError as err:  # exit here: Hydra would log a second line for an exception
            print(f"ddl-run: error: {err}", file=sys.stderr)
            sys.exit(2)

    return app


def _run_one(cfg):
    from .launch.job import run_task
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


def ui_main() -> None:
    _dispatch("ddl.track.ui")
