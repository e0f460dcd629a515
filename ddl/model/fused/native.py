"""Builds cpu.cpp into torch.ops.ddl_delta once per machine, on first use.

torch.utils.cpp_extension compiles it (about 15 s on 2 cores) into torch's extension cache
(TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions), one build per Python, torch and CPU
vector width, so a cluster's shared home serves every node; later processes load it in
milliseconds. Where it cannot be built (no compiler, no ninja) the fused ops run their eager
loops, with one warning. DDL_NATIVE_KERNELS=0 asks for the eager loops outright.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import sys
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu.cpp")
# torch's runtime CPU dispatch level -> the compiler flags for that vector width (never -march=native:
# the build is shared by every machine of the same level).
VECTOR_FLAGS = {"AVX2": ["-mavx2", "-mfma"], "AVX512": ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mfma"]}


# Whether the native loops run (C++ on CPU, Triton on CUDA): DDL_NATIVE_KERNELS, read once per process (the ops ask
# per call, a dispatch-bound step's time); eager_loops() switches them off within one.
ENABLED = os.environ.get("DDL_NATIVE_KERNELS", "1") != "0"


def enabled() -> bool:
    return ENABLED


@contextlib.contextmanager
def eager_loops():
    """The PyTorch-op loops everywhere while it lasts, as DDL_NATIVE_KERNELS=0 asks for a whole process."""
    global ENABLED
    before, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = before


def build_directory() -> Path:
    """Where this checkout's build for this Python, torch and CPU vector width lives, under torch's
    extension cache. Two checkouts (or installs) share no directory: torch rebuilds whenever the
    source path in its build file changes, so shared, they would rebuild each other's in turn."""
    from torch.utils import cpp_extension

    level = torch.backends.cpu.get_cpu_capability()
    checkout = hashlib.sha256(str(SOURCE.resolve()).encode()).hexdigest()[:8]
    tag = f"py{sys.version_info.major}{sys.version_info.minor}_torch{torch.__version__}_{level}_{checkout}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / "ddl_delta" / tag.replace(".", "").replace("+", "_")


@contextlib.contextmanager
def build_lock():
    """The build directory's own lock (flock: released by the OS even if its holder is killed), held by whoever builds
    or loads there: torch's own lock file in it is made and removed only under it. Yields the directory."""
    build_dir = build_directory()
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "ddl.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield build_dir


@functools.cache
def ops():
    """torch.ops.ddl_delta, built or loaded; None if it cannot be built (after one warning)."""
    from torch.utils import cpp_extension

    build_dir = build_directory()
    vector_flags = VECTOR_FLAGS.get(torch.backends.cpu.get_cpu_capability(), [])
    try:
        with build_lock():
            (build_dir / "lock").unlink(missing_ok=True)  # torch's own lock file, left by a killed build
            cpp_extension.load(name="ddl_delta", sources=[str(SOURCE)], build_directory=str(build_dir),
                               extra_cflags=["-O3", "-fopenmp", *vector_flags],
                               extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except Exception as error:  # noqa: BLE001 - any build failure falls back to the eager loops
        lines = str(error).strip().splitlines()
        reason = next((line.strip() for marker in ("error:", "error") for line in lines if marker in line.lower()),
                      lines[-1] if lines else repr(error))
        warnings.warn(f"ddl: the C++ Delta kernels could not be built in {build_dir} ({reason}); "
                      f"the fused kernels run as PyTorch ops on CPU (slower; the same numbers up to float rounding)",
                      stacklevel=2)
        return None
    _register_fakes()
    return torch.ops.ddl_delta


def _register_fakes() -> None:
    """Output shapes for torch.compile's tracing (train.compile=true traces through the fused ops).
    Every output is a new contiguous tensor in the computing dtype (at least fp32), as cpu.cpp makes them."""
    def new(t, shape=None):
        return t.new_empty(t.shape if shape is None else shape, dtype=torch.promote_types(t.dtype, torch.float32))

    def by_step(X, steps):                            # w, rho, q of update_steps_forward
        B, T, dv, _ = X.shape
        return new(X, (B, T, steps, dv)), new(X, (B, T, steps)), new(X, (B, T, steps, dv))

    fakes = {
        "update_forward": lambda X, h, beta, v, eps2: (new(X), new(v), new(beta), new(v)),
        "update_backward": lambda G, g_w, X, h, beta, v, rho, q: (new(X), new(h), new(beta), new(v)),
        "key_forward": lambda X, h, beta, v, eps2: (new(v), new(beta), new(v)),
        "write_forward": lambda X, h_a, w_a, h, beta, v, A, eps2, store: (new(X) if store else new(X, (0,)), new(v),
                                                                            new(beta), new(v), new(h)),
        "write_backward": lambda G, g_w, g_next, X, h_a, w_a, h, beta, v, rho, q, A: (new(X), new(h), new(beta),
                                                                                      new(v), new(A)),
        "update_steps_forward": lambda X, h, beta, v, eps2: (new(X), *by_step(X, len(h))),
        "update_steps_backward": lambda G, g_w, X, h, beta, v, rho, q: (new(X), new(X, rho.shape + X.shape[3:]),
                                                                         new(rho), new(q)),
        "read_forward": lambda X, A: new(X, X.shape[:2] + X.shape[3:]),
        "read_backward": lambda g, X, A: (new(X), new(A)),
        "rank_one_forward": lambda w, h, A: new(h),
        "rank_one_backward": lambda g, w, h, A: (new(w), new(h), new(A)),
        "expand_forward": lambda x, E: new(x, x.shape[:2] + E.shape[:2]),
        "expand_backward": lambda g, x, E: (new(x), new(E)),
        "norm_forward": lambda x, g, W_c, W_x, b_c, b_x, s_c, s_x, eps: (
            new(x), new(x, x.shape[:-1] + W_c.shape[:1]), new(x, x.shape[:-1] + W_x.shape[:1]),
            new(x, x.shape[:-1] + (1,))),
        "norm_backward": lambda g_c, g_yc, g_yx, x, g, W_c, W_x, b_c, b_x, s_c, s_x, rho, y_c, y_x: (
            new(x), new(g), new(W_c), new(W_x), new(x, (0,) if b_c is None else b_c.shape),
            new(x, (0,) if b_x is None else b_x.shape)),
    }
    for name, fake in fakes.items():
        torch.library.register_fake(f"ddl_delta::{name}")(fake)
