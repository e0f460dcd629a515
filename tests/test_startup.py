"""What every command pays before it does anything: the import graph of ddl, `ddl-run --help`, and the dry
run, which must write nothing and work where DDL_HOME and the working directory are read-only."""

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "ddl"


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
