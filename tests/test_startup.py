"""What every command pays before it does anything: the import graph of ddl, `ddl-run --help`, and the dry
run, which must write nothing and work where DDL_HOME and the working directory are read-only."""

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, VENV_BIN, run_cli, slow_except

PACKAGE = ROOT / "ddl"
# Run a command ("$2"...) with the folder "$1" mounted read-only, in a mount namespace of its own: permission
# bits do not stop root (the suite's user), a read-only mount does, and it ends with the command.
READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'


def _modules() -> dict[str, Path]:
    """ddl's modules by dotted name (a package by its own name, for its __init__.py)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ddl modules that `name` imports anywhere in its file (in a function too: a lazy import closes a
    circle as well, on first use)."""
    def module_of(dotted: str) -> str | None:        # the deepest ddl module a dotted name lies in
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(module_of(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:                           # from . / from .. / from .x
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else module_of(base) for a in node.names)
    return found - {None, name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (its modules, the first repeated at the end), else None."""
    state: dict[str, str] = {}                       # "open" while on the current path, then "done"

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (circle := visit(target, [*path, target])):
                return circle
        state[module] = "done"
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


def test_no_module_of_ddl_imports_in_a_circle():
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    assert "ddl.data.config" in graph["ddl.data.sources"] and "ddl.paths" in graph["ddl.data.tokenizers"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_circle_check_sees_a_lazy_import_and_finds_a_circle(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("from . import b\n\n\ndef f():\n    from .c import g\n    import pkg.d\n")
    modules = {name: tmp_path / "pkg" / f"{name[4:]}.py" for name in ("pkg.a", "pkg.b", "pkg.c", "pkg.d")}
    assert _imported("pkg.a", modules["pkg.a"], modules) == {"pkg.b", "pkg.c", "pkg.d"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


MAX_FUNCTION_LINES = 50


def _long_functions(paths) -> list[str]:
    """`file:function (lines)` for each function or method over MAX_FUNCTION_LINES lines, its docstring included."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(path.parents[1])}:{node.name} ({lines})")
    return found


def test_no_function_is_over_50_lines():
    """A house of small rooms: a function that grows past a screen becomes named steps."""
    assert _long_functions(sorted(PACKAGE.rglob("*.py")) + sorted((ROOT / "hydra_plugins").rglob("*.py"))) == []


def test_the_length_check_finds_a_long_method(tmp_path):
    body = "\n".join(f"        x = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(f"class A:\n    def long(self):\n{body}\n\n\ndef short():\n    pass\n")
    assert _long_functions([tmp_path / "pkg" / "a.py"]) == [f"pkg/a.py:long ({MAX_FUNCTION_LINES + 1})"]


def _hydras_own_help(overrides: list[str]) -> str:
    """The page Hydra's own `--help` prints for ddl-run's config (in this process)."""
    import contextlib
    import io

    from ddl.launch.configs import conf_dir
    from ddl.launch.hydra_private import args_parser, main_hydra
    hydra = main_hydra(str(conf_dir()))
    page = io.StringIO()
    with contextlib.redirect_stdout(page):
        hydra.app_help("config", args_parser(), args_parser().parse_args(["--help", *overrides]))
    return page.getvalue()


@pytest.mark.parametrize("overrides", slow_except({"plain": [], "overrides": ["model=micro", "+sweep=smoke", "dv=4"]},
                                                   "plain"))
def test_ddl_run_help_prints_hydras_page(ddl_home, tmp_path, overrides):
    """ddl-run lists the config groups itself (Hydra's --help takes most of its time copying its config
    repository, once per group): the page is Hydra's own, to the character, and nothing is written."""
    from hydra.core.global_hydra import GlobalHydra

    from ddl.launch.configs import register
    register()
    try:
        expected = _hydras_own_help(overrides)
    finally:
        GlobalHydra.instance().clear()
    out = run_cli("ddl-run", *overrides, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    listing = out.stdout.split("== Groups")[1].split("== Config")[0].splitlines()[1:]
    groups = dict(line.split(": ", 1) for line in listing if ": " in line)
    assert out.stdout == expected and {"smoke", "paper_small"} <= set(groups["sweep"].split(", "))  # ConfigStore's
    assert "micro" in groups["model"].split(", ") and not list(tmp_path.iterdir()) and not ddl_home.exists()


def test_ddl_run_help_imports_neither_hydra_nor_torch(tmp_path):
    """Plain --help composes the default config with OmegaConf alone (ddl.launch.help): Python's own import log
    (-X importtime) names no hydra and no torch module."""
    out = subprocess.run([str(VENV_BIN / "python"), "-X", "importtime", str(VENV_BIN / "ddl-run"), "--help"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and "== Config ==" in out.stdout, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "ddl.launch.help" in imported and "omegaconf" in imported
    assert not {m for m in imported if m.split(".")[0] in ("hydra", "torch", "mlflow", "submitit")}


def _read_only(folder: Path, *command: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "--mount", "sh", "-c", READ_ONLY, "sh", str(folder), *command], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_dry_run_writes_nothing_and_works_where_ddl_home_and_the_working_directory_are_read_only(ddl_home,
                                                                                                  tmp_path):
    root, cwd = tmp_path / "read-only", tmp_path / "read-only" / "cwd"
    cwd.mkdir(parents=True)
    if shutil.which("unshare") is None or _read_only(root, "true", cwd=tmp_path).returncode:
        pytest.skip("no read-only bind mount here (needs root and unshare)")
    refused = _read_only(root, "touch", str(cwd / "probe"), cwd=tmp_path)
    assert refused.returncode and "Read-only file system" in refused.stderr
    ddl_run = str(VENV_BIN / "ddl-run")
    for home, args in ((root / "home", ["--dry-run"]), (cwd, ["-m", "+sweep=smoke", "--dry-run"])):
        out = _read_only(root, "env", f"DDL_HOME={home}", ddl_run, *args, cwd=cwd)
        assert out.returncode == 0 and "to run" in out.stdout, out.stderr[-2000:]
    assert [p.name for p in root.rglob("*")] == ["cwd"]
    writable = run_cli("ddl-run", "-m", "+sweep=smoke", "--dry-run", cwd=cwd)   # DDL_HOME: ddl_home, not made
    assert writable.returncode == 0 and "to run" in writable.stdout and not ddl_home.exists()
    assert [p.name for p in root.rglob("*")] == ["cwd"]
