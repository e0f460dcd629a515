import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

VENV_BIN = Path(sys.executable).parent
# Where the device-aware tests (the Triton kernels, bf16, compile) run: DDL_TEST_DEVICE, else CUDA if present.
TEST_DEVICE = torch.device(os.environ.get("DDL_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))


def _import_triton_kernels_interpreted() -> None:
    """Triton decides whether a function is interpreted as it decorates it, on import: its own
    library's (some on a kernel's first launch) and our kernels' (ddl/model/fused/triton_loops.py).
    Their tests run the kernels on CPU tensors under its interpreter, and torch._dynamo imports
    triton as soon as a test imports ddl.model: so without a GPU both are imported, and one kernel
    launched, here first, with TRITON_INTERPRET=1 set for that only (nothing else on CPU runs triton)."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        from ddl.model.fused import triton_loops
        triton_loops.read_forward(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1))  # its first launch imports more
    except ImportError:
        pass                                           # no triton: tests/test_triton_kernels.py skips, saying so
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


if TEST_DEVICE.type == "cpu":
    _import_triton_kernels_interpreted()


@pytest.fixture
def ddl_home(tmp_path, monkeypatch):
    home = tmp_path / "ddl_home"
    monkeypatch.setenv("DDL_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


@pytest.fixture(scope="module")
def module_ddl_home(tmp_path_factory):
    """One DDL_HOME for a whole module, for fixtures that run a sweep once and share it."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("ddl_home")
        mp.setenv("DDL_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield home


def run_cli(tool: str, *args: str, cwd=None, timeout=600, env_extra=None) -> subprocess.CompletedProcess:
    """Run an installed console script (ddl-run, ddl-report, ...) the way a user does."""
    return subprocess.run([str(VENV_BIN / tool), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})})


def mlflow_runs(experiment: str):
    from ddl.track import store
    c = store.client()
    exp = c.get_experiment_by_name(experiment)
    return [] if exp is None else c.search_runs([exp.experiment_id])
