"""Private names of the dependencies (MLflow, submitit, torch, Hydra, the runtime's threading and atexit) live in one
module per dependency (`*_private.py`), and each module's names are checked here against the installed version: an
upgrade that moves one fails here, naming the dependency, its version and the version the module was checked with."""

import ast
import contextlib
import inspect
import os
import platform
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPENDENCIES = ("mlflow", "submitit", "torch", "hydra", "threading", "atexit")
PUBLIC_UNDERSCORED = {"_exit", "_replace", "_asdict", "_fields", "_make", "_fixtureinfo"}   # os, namedtuple, pytest


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _sources(root: Path) -> list[Path]:
    """The project's Python, less the private modules and this file, which checks their names."""
    return [path for folder in ("ddl", "hydra_plugins", "tests", "scripts") for path in (root / folder).rglob("*.py")
            if not path.stem.endswith("_private") and path.name != Path(__file__).name]


def _names_the_project_defines(trees: list[ast.AST]) -> set[str]:
    """Functions, classes, variables, arguments and attributes set on self or cls: what `x._name` may mean of ours."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
    return names


def _dependency_uses(root: Path, path: Path, tree: ast.AST, ours: set[str]) -> list[str]:
    """`path:line: name` for each private name of a dependency: an import of a private module or name, or an
    attribute (or getattr string) that begins with `_` and that the project does not define."""
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.split(".")[0] in DEPENDENCIES:
            names = [f"{node.module}.{alias.name}" for alias in node.names
                     if any(map(_private, [*node.module.split("."), alias.name]))]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.split(".")[0] in DEPENDENCIES
                     and any(map(_private, alias.name.split(".")))]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in ours:
            names = [f".{node.attr}"]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr") and \
                len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and \
                isinstance(node.args[1].value, str) and _private(node.args[1].value) and node.args[1].value not in ours:
            names = [f".{node.args[1].value}"]
        found += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in names
                  if name.lstrip(".") not in PUBLIC_UNDERSCORED]
    return found


def private_uses_outside_their_modules(root: Path) -> list[str]:
    paths = _sources(root)
    trees = {path: ast.parse(path.read_text(), str(path)) for path in paths}
    ours = _names_the_project_defines(list(trees.values()))
    return [line for path, tree in trees.items() for line in _dependency_uses(root, path, tree, ours)]


def test_every_private_name_of_a_dependency_sits_in_its_module():
    assert private_uses_outside_their_modules(ROOT) == []


def test_the_check_finds_a_private_import_an_attribute_and_a_getattr(tmp_path):
    (tmp_path / "ddl").mkdir()
    (tmp_path / "ddl" / "a.py").write_text(
        "import torch._dynamo\nfrom hydra._internal.utils import get_args_parser\n"
        "def f(job):\n    job._results_timeout_s = 0\n    return getattr(job, '_process', None)\n")
    (tmp_path / "ddl" / "b_private.py").write_text("from torch.utils._pytree import tree_leaves\n")
    assert private_uses_outside_their_modules(tmp_path) == [
        "ddl/a.py:1: torch._dynamo", "ddl/a.py:2: hydra._internal.utils.get_args_parser",
        "ddl/a.py:4: ._results_timeout_s", "ddl/a.py:5: ._process"]


@contextlib.contextmanager
def checked_against(module, installed: str):
    """A failure inside names the dependency's installed version and the one the module was checked with."""
    try:
        yield
    except Exception as err:
        raise AssertionError(f"{module.__name__} (checked with {module.CHECKED_WITH}) fails on {installed}: "
                             f"{type(err).__name__}: {err}") from err


def test_torchs_private_names():
    import torch

    from ddl.model import torch_private as module
    with checked_against(module, f"torch {torch.__version__}"):
        module.raise_recompile_limit(4096)
        import torch._dynamo
        assert max(getattr(torch._dynamo.config, name, 0) for name in ("recompile_limit", "cache_size_limit")) == 4096
        flag = [True]

        @module.assume_constant_result
        def on() -> bool:
            return flag[0]
        step = torch.compile(lambda x: x + 1 if on() else x - 1, backend="eager", fullgraph=True)
        assert step(torch.zeros(1)).item() == 1
        flag[0] = False
        assert step(torch.zeros(1)).item() == 1, "the mark no longer makes dynamo take the result as a constant"
        torch.compiler.reset()
        t = torch.ones(2)
        assert module.tree_leaves({"a": (t, 3)}) == [t, 3]
        seen = []

        class Seen(module.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                seen.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))
        with module.FakeTensorMode():
            fake = torch.empty(1 << 30)
            with Seen():
                (fake + 1).sum()
            assert isinstance(module.storage_key(fake.untyped_storage()), int)
        assert seen == ["add", "sum"]


def test_mlflows_private_names(tmp_path):
    from ddl.track import mlflow_private as module
    with checked_against(module, f"mlflow {version('mlflow')}"):
        (tmp_path / "empty.db").write_bytes(b"")
        assert not module.at_schema_head(tmp_path / "empty.db")
        module.create_schema(tmp_path / "schema.db")
        assert module.at_schema_head(tmp_path / "schema.db")
        taken = []
        monitor = module.system_metrics_monitor("0" * 32, f"sqlite:///{tmp_path / 'schema.db'}",
                                                lambda metrics, step: taken.append((metrics, step)))
        try:
            monitor.publish_metrics({"cpu_utilization_percentage": 5.0})
        finally:
            monitor.finish()
        assert taken[0] == ({"system/cpu_utilization_percentage": 5.0}, 0)


def test_submitits_private_names(tmp_path):
    import submitit

    from ddl.launch import submitit_private as module
    with checked_against(module, f"submitit {version('submitit')}"):
        job = submitit.LocalExecutor(tmp_path / "local").submit(int, "3")
        assert module.local_process(job).pid > 0
        assert hasattr(job, "_results_timeout_s"), "submitit's wait for a result file has moved"
        module.stop_waiting_for_results(job)
        assert job.result() == 3
        local = submitit.AutoExecutor(tmp_path / "pinned", cluster="local")
        local.update_parameters(gpus_per_node=1)
        module.pin_local_gpus(local, [3])
        pinned = local.submit(os.getenv, "CUDA_VISIBLE_DEVICES")
        assert pinned.result() == "3"
        executor = submitit.AutoExecutor(tmp_path / "slurm", cluster="slurm")
        executor.update_parameters(slurm_partition="probe")
        script = module.slurm_script(executor)
        assert "#SBATCH --partition=probe" in script and "-m submitit.core._submit" in script


def test_hydras_private_names():
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode

    from ddl.launch import hydra_private as module
    from ddl.launch.configs import conf_dir, register
    with checked_against(module, f"hydra-core {version('hydra-core')}"):
        assert module.args_parser().parse_args(["-m", "seed=1"]).multirun
        register()
        try:
            hydra = module.main_hydra(str(conf_dir()))
            cfg = hydra.compose_config("config", [], run_mode=RunMode.RUN)
            repo = module.caching_repo(hydra.config_loader, "config", [])
            [group, value] = OverridesParser.create().parse_overrides(["model=micro", "seed=7"])
            assert (module.is_config_override(repo, group), module.is_config_override(repo, value)) == (False, True)
            module.apply_overrides([value], cfg)
            assert cfg.seed == 7
            module.callbacks(cfg)
            # Hydra's run reads the mode through the probe mode_from_flags replaces, which answers as it would for a
            # config that leaves hydra.mode unset
            from hydra._internal import utils as hydra_utils
            assert "hydra.get_mode(" in inspect.getsource(hydra_utils._run_hydra)
            assert hydra.get_mode("config", ["hydra.mode=MULTIRUN"]) == RunMode.MULTIRUN
            assert hydra.get_mode("config", []) is None
            with module.mode_from_flags():
                assert hydra.get_mode("config", ["hydra.mode=MULTIRUN"]) is None
            assert hydra.get_mode("config", ["hydra.mode=MULTIRUN"]) == RunMode.MULTIRUN
        finally:
            GlobalHydra.instance().clear()
        sweeper = module.basic_sweeper()(max_batch_size=None, params={"seed": "1,2"})
        assert module.sweep_overrides(sweeper) == ["seed=1,2"]
        failed = JobReturn(status=JobStatus.FAILED, _return_value=ValueError("boom"))
        assert str(module.job_exception(failed)) == "boom"


def test_the_runtimes_private_names():
    from ddl.launch import interpreter_private as module
    with checked_against(module, f"Python {platform.python_version()}"):
        script = ("import atexit, os, threading, time\n"
                  "from ddl.launch.interpreter_private import finish_as_at_exit\n"
                  "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
                  "atexit.register(print, 'atexit')\n"
                  "finish_as_at_exit()\nos._exit(0)\n")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.stdout.split() == ["thread", "atexit"], out.stderr
