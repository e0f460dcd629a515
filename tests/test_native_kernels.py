"""The C++ build of the fused kernels (ddl/model/fused/native.py): it builds here, declares its
outputs for torch.compile, survives a build killed midway, and falls back to the PyTorch-op loops
where no compiler works."""

import os
import subprocess
import sys

import torch

from ddl.model.fused import native

D, DV, K_EPS = 16, 4, 1e-5
MICRO_LOSS = """
import torch
from ddl.model import GPT, model_config
torch.manual_seed(0)
model = GPT(model_config("micro", vocab_size=64, residual="ddl", dv=4, conv="ec"))
idx = torch.arange(24).view(2, 12) % 64
_, loss = model(idx, idx)
loss.backward()
print(repr(loss.item()), repr(model.blocks[0].compress.read.grad.sum().item()))
"""


def python(code: str, timeout: float, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def op_calls(ops, B: int, T: int) -> dict:
    """Every C++ op, forward and backward, with random float32 arguments of these sizes (the norm with its gates
    activated and without)."""
    g = torch.Generator().manual_seed(9)
    L = 4
    X, k_raw, v, w = (torch.randn(*shape, generator=g) for shape in ((B, T, DV, D), (B, T, D), (B, T, DV), (B, T, DV)))
    beta = torch.rand(B, T, 1, generator=g)
    taps = torch.randn(D, DV, L, generator=g).transpose(0, 1)                   # not contiguous, as the model's
    G, g_x = torch.randn(B, T, DV, D, generator=g), torch.randn(B, T, D, generator=g)
    _, _, rho, q = ops.update_forward(X, k_raw, beta, v, K_EPS ** 2)
    steps = ([k_raw, -k_raw], [beta, 1 - beta], [v, v.flip(-1)])                 # two DeltaProduct steps
    _, w_by_step, rho_by_step, q_by_step = ops.update_steps_forward(X, *steps, K_EPS ** 2)
    calls = {"update_forward": (X, k_raw, beta, v, K_EPS ** 2), "update_backward": (G, w, X, k_raw, beta, v, rho, q),
             "update_steps_forward": (X, *steps, K_EPS ** 2),
             "update_steps_backward": (G, w_by_step, X, *steps, rho_by_step, q_by_step),
             "read_forward": (X, taps), "read_backward": (g_x, X, taps), "rank_one_forward": (w, k_raw, taps),
             "rank_one_backward": (g_x, w, k_raw, taps), "expand_forward": (k_raw, taps),
             "expand_backward": (G, k_raw, taps),
             }
    W_c, W_x, b_c, b_x = X[0, 0, :1], X[0, 1], torch.randn(1, generator=g), torch.randn(DV, generator=g)
    for gated, gates in (("", (b_c, b_x, 2.0, 4.0)), (" ungated", (None, None, 1.0, 1.0))):   # beta, v; the MLP's
        calls["norm_forward" + gated] = inputs = (k_raw, k_raw[0, 0], W_c, W_x, *gates, 1e-6)
        c, y_c, y_x, rho_norm = ops.norm_forward(*inputs)
        calls["norm_backward" + gated] = (torch.randn_like(c, generator=g), torch.randn_like(y_c, generator=g),
                                          torch.randn_like(y_x, generator=g), *inputs[:-1], rho_norm, y_c, y_x)
    return calls


def test_cpp_ops_declare_their_outputs_for_torch_compile():
    """Each C++ op's schema and fake (what torch.compile traces with) match what the op returns."""
    ops = native.ops()
    assert ops is not None, "the C++ kernels did not build"
    for name, args in op_calls(ops, B=2, T=5).items():
        result = torch.library.opcheck(getattr(ops, name.split()[0]).default, args,
                                       test_utils=("test_schema", "test_faketensor"))
        assert set(result.values()) == {"SUCCESS"}, (name, result)


def _autograd_nodes(loss: torch.Tensor) -> set[str]:
    """The names of every node of loss's backward graph."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [next_node for next_node, _ in node.next_functions]
    return {node.name() for node in seen}


def test_an_eager_cpu_step_records_the_delta_ops_autograd_in_cpp_and_compiled_traces_the_python_functions():
    """Eagerly on CPU every sublayer's Delta ops are the C++ ops with their autograd in C++ (no Python Function in
    the graph: a small step's dispatch); with the C++ loops off, and under torch.compile, the Python Functions."""
    from ddl.model import GPT, model_config
    idx = torch.arange(24).view(2, 12) % 64
    cpp = {1: {"DeltaUpdate", "NormProjections"}, 4: {"DeltaKey", "DeltaWrite", "NormProjections"}}
    for dv, names in cpp.items():
        model = GPT(model_config("micro", vocab_size=64, residual="ddl", dv=dv))
        nodes = _autograd_nodes(model(idx, idx)[1])
        assert {f"torch::autograd::CppNode<(anonymous namespace)::{name}>" for name in names} <= nodes, nodes
        assert not any(name.startswith(("FusedDeltaUpdate", "DeltaKey", "DeltaWrite", "FusedNorm")) for name in nodes)
        with native.eager_loops():
            assert not any("CppNode" in name for name in _autograd_nodes(model(idx, idx)[1]))
    model.compile_blocks(backend="aot_eager")
    assert not any("CppNode" in name for name in _autograd_nodes(model(idx, idx)[1]))


def test_the_cpp_kernels_give_the_same_bits_whatever_the_thread_count():
    """A run resumed on a node with other CPUs (a SLURM requeue) continues the same curve as far as our
    kernels go: their sums over tokens are chunked by the token count alone. (torch's own CPU ops, the
    matmuls around them, promise no such thing across thread counts, so this tests our ops alone.)"""
    ops = native.ops()
    assert ops is not None, "the C++ kernels did not build"
    calls = op_calls(ops, B=4, T=128)                                            # 512 tokens: several chunks
    results, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append({name: getattr(ops, name.split()[0])(*args) for name, args in calls.items()})
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for name, outputs in other.items():
            assert all(torch.equal(a, b) for a, b in zip(results[0][name], outputs, strict=True)), name


def test_a_build_killed_midway_does_not_hang_the_next_process():
    """torch's own build lock is a plain file: a build killed by SIGKILL (a SLURM time-out, the OOM
    killer) leaves it, and torch alone would then wait on it forever. The test touches torch's lock only under the
    build lock, as every loading process does: a process of another test loading the kernels meanwhile is left alone."""
    assert native.ops() is not None
    with native.build_lock() as build_dir:
        stale = build_dir / "lock"
        stale.touch()
    try:
        done = python("from ddl.model.fused import native; assert native.ops() is not None", timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        with native.build_lock():
            assert not stale.exists()
    finally:
        with native.build_lock():
            stale.unlink(missing_ok=True)


def test_without_a_compiler_the_fused_kernels_run_as_pytorch_ops(tmp_path):
    done = python(MICRO_LOSS, timeout=300, CXX="/bin/false", TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the C++ Delta kernels could not be built" in done.stderr and "/bin/false" in done.stderr
    built = python(MICRO_LOSS, timeout=300)
    assert built.returncode == 0 and "could not be built" not in built.stderr, built.stderr[-2000:]
    eager, cpp = (torch.tensor([float(value) for value in run.stdout.split()]) for run in (done, built))
    assert torch.allclose(eager, cpp, atol=1e-5)                                   # loss, a taps gradient
