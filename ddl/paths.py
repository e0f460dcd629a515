"""Where the project keeps what it generates: one fixed home per project.

`DDL_HOME` overrides it. Otherwise a source checkout keeps everything in `<checkout>/.ddl`
(so `make report` and `make ui` find every run, whatever directory a run started from),
and an installed wheel uses `~/.local/share/ddl`.

    $DDL_HOME/mlflow.db        MLflow tracking store (SQLite)
    $DDL_HOME/mlartifacts/     MLflow artifacts
    $DDL_HOME/data/<name>/     token shards + manifest + tokenizer
    $DDL_HOME/runs/<sig>/      checkpoints and logs of one run, named by its signature
    $DDL_HOME/sweeps/<name>/   launcher logs (submitit)
    $DDL_HOME/home_id          this home's id in a shared tracking store (made once)
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import BinaryIO, Callable

_CHECKOUT = Path(__file__).resolve().parent.parent


def project_root() -> Path | None:
    """The source checkout this package runs from, or None for an installed wheel."""
    return _CHECKOUT if (_CHECKOUT / "pyproject.toml").is_file() else None


def home() -> Path:
    env = os.environ.get("DDL_HOME")
    if env:
        return Path(env).expanduser().resolve()
    root = project_root()
    return root / ".ddl" if root else Path.home() / ".local" / "share" / "ddl"


def user_cache_dir() -> Path:
    """What any home of this user may reuse (derived from installed packages only): XDG's cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddl"


def data_dir() -> Path:
    return home() / "data"


def runs_dir() -> Path:
    return home() / "runs"


def project_store_uri() -> str:
    return f"sqlite:///{home() / 'mlflow.db'}"


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI wins (a team server); else the project's SQLite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or project_store_uri()


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///` store URI; None for any other store (a server's)."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def artifacts_dir(uri: str | None = None) -> Path | None:
    """Where a SQLite store (the project's unless `uri` names another) keeps its runs' artifacts: mlartifacts/
    beside its database, as DDL_HOME/mlartifacts beside DDL_HOME/mlflow.db, rather than MLflow's ./mlruns of
    whatever directory created an experiment. None for a server's store, whose server decides."""
    db = sqlite_file(uri or project_store_uri())
    return None if db is None else db.absolute().parent / "mlartifacts"


def reports_dir() -> Path:
    root = project_root()
    return (root / "reports") if root else home() / "reports"


def home_id() -> str:
    """A random id for this home, made once: a shared tracking store tells homes apart by it (one host
    may hold several homes, and one home on a cluster's shared disk serves many hosts)."""
    path = home() / "home_id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        import secrets
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".home_id.{os.getpid()}.tmp")
        tmp.write_text(secrets.token_hex(6) + "\n")
        try:
            os.link(tmp, path)                   # whole or absent: the first process to link names the home
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return path.read_text().strip()


def prune(folder: Path) -> None:
    """Remove `folder`, then each parent in turn, while it is empty: below DDL_HOME only (never DDL_HOME
    itself, nor a folder outside it). What a refused run made goes with it; a folder that holds
    anything, another process's included, stays."""
    top = home()
    while top in folder.parents:
        try:
            folder.rmdir()
        except OSError:             # not empty, or not there
            return
        folder = folder.parent


def write_atomic(path: Path, data: bytes | str | Callable[[BinaryIO], object], durable: bool = False) -> None:
    """Write through a temp file and a rename: a reader sees the old file or the new one, never a
    torn one. `data` is the content, or a function that writes it to the open file (torch.save).
    `durable` also fsyncs, so the new content survives a machine crash (shards, checkpoints).
    A failed write (a full disk) removes its temp file and leaves the old file as it was."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def git_state() -> tuple[str, str]:
    """(the checkout's commit, whether its tracked files differ from it: "true" | "false"); "unknown" outside git."""
    root = project_root()
    if root is None:
        return "unknown", "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return commit or "unknown", str(bool(dirty)).lower()
    except OSError:
        return "unknown", "unknown"
