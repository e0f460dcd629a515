"""The Triton loops (ddl/model/fused/triton_loops.py, what kernels=fused runs on CUDA) against the
plain forms in ddl/model/delta.py, in value and gradient.

Without a GPU they run on CPU tensors under triton's interpreter (tests/conftest.py imports them
with TRITON_INTERPRET=1, set for that import only); on a machine with one (`make gpu-check`) the same
tests run on CUDA tensors, the kernels compiled.

Tolerances, against the float64 plain form of the same (rounded) inputs:
- fp32: rtol 1e-5 and atol 1e-5 x the largest |value|: fp32 arithmetic, sums of at most ~100 terms.
- bf16: rtol 2^-7 (one bf16 ulp at worst), same atol. The kernels load bf16, compute in fp32 and
  round each output once: to nearest on a GPU (within half an ulp), toward zero under the
  interpreter (within one). Accumulating in bf16 instead would miss by several ulps over d = 80 terms.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from ddl.model import GPT, model_config
from ddl.model import fused
from ddl.model.delta import delta_update, delta_update_steps, expand_state, rank_one_read, state_read
from ddl.model.fused import eager
from tests.conftest import TEST_DEVICE

DEVICE = TEST_DEVICE
triton = pytest.importorskip("triton", reason="triton is not installed (a dev dependency on Linux x86_64 only)")
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    pytest.skip("DDL_TEST_DEVICE=cuda, but torch sees no CUDA device", allow_module_level=True)
from ddl.model.fused import triton_compile, triton_loops  # noqa: E402  (registers torch.ops.ddl_triton)
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if DEVICE.type == "cpu" and not isinstance(triton_loops._read_forward_kernel, InterpretedFunction):
    pytest.skip("triton was imported before tests/conftest.py could import it with TRITON_INTERPRET=1: "
                "the kernels cannot run on CPU in this process", allow_module_level=True)

ops = torch.ops.ddl_triton

B, T, D = 2, 7, 80                 # d not a power of two and two feature blocks (64 + 16)
K_EPS = 1e-5
DVS = [1, 2, 4, 8]
DTYPES = [torch.float32, torch.bfloat16]


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tensors(seed: int, dtype: torch.dtype, *shapes, positive=()) -> list[torch.Tensor]:
    """Random tensors of these shapes on DEVICE in dtype; those indexed in `positive` uniform in [0, 2)."""
    g = generator(seed)
    out = [2 * torch.rand(s, generator=g) if n in positive else torch.randn(s, generator=g)
           for n, s in enumerate(shapes)]
    return [t.to(DEVICE, dtype) for t in out]


def assert_near(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """actual (the kernel's, in the inputs' dtype) against the float64 reference, at the module's tolerances."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if not expected.numel():
        return
    rtol = 2 ** -7 if actual.dtype == torch.bfloat16 else 1e-5
    atol = 1e-5 * expected.abs().max().item()
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def reference(plain, inputs, cotangents, **kw):
    """The plain form's outputs and its inputs' gradients for these cotangents, in float64."""
    leaves = [t.double().requires_grad_() for t in inputs]
    outputs = plain(*leaves, **kw)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    grads = torch.autograd.grad(outputs, leaves, [c.double() for c in cotangents])
    return [o.detach() for o in outputs], grads


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dv", DVS)
def test_update_matches_the_plain_form(dv, dtype):
    X, h, beta, v = tensors(1, dtype, (B, T, dv, D), (B, T, D), (B, T, 1), (B, T, dv), positive=(2,))
    G, g_w = tensors(2, dtype, (B, T, dv, D), (B, T, dv))
    (X_new, w), grads = reference(delta_update, [X, h, beta, v], [G, g_w], k_eps=K_EPS)
    out = ops.update_forward(X, h, beta, v, K_EPS ** 2)
    for name, a, b in zip(("X_new", "w"), out[:2], (X_new, w), strict=True):
        assert_near(a, b, name)
    # backward takes rho and q as the forward saved them; in fp32 here, so that the bf16 case
    # measures the backward's own rounding, not that of its saved inputs
    rho = (h.double().pow(2).sum(-1, keepdim=True) + K_EPS ** 2).rsqrt()
    q = (X.double() * h.double().unsqueeze(-2)).sum(-1)
    for cotangent_w, expected in ((g_w, grads), (None, reference(delta_update, [X, h, beta, v], [G, 0 * g_w],
                                                                 k_eps=K_EPS)[1])):
        got = ops.update_backward(G, cotangent_w, X, h, beta, v, rho.float(), q.float())
        for name, a, b in zip(("X", "k~", "beta", "v"), got, expected, strict=True):
            assert_near(a, b, f"dL/d{name} (dL/dw {'given' if cotangent_w is not None else 'absent'})")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dv", DVS)
def test_key_matches_the_plain_update_without_its_state(dv, dtype):
    """DeltaKey's forward: w, and the rho and q the update's backward takes, of a state read in place when it is a
    repeated embedding (channel stride 0) and when contiguous."""
    X, h, beta, v = tensors(15, dtype, (B, T, dv, D), (B, T, D), (B, T, 1), (B, T, dv), positive=(2,))
    for state in (X, X[:, :, :1].expand(B, T, dv, D)):
        (_, w), _ = reference(delta_update, [state, h, beta, v], [state, v], k_eps=K_EPS)
        got_w, rho, q = ops.key_forward(state, h, beta, v, K_EPS ** 2)
        assert got_w.dtype == rho.dtype == q.dtype == torch.float32
        assert_near(got_w, w, "w")
        assert_near(q, (state.double() * h.double().unsqueeze(-2)).sum(-1), "q")


def write_plain(X_mid, h, beta, v, A, k_eps):
    """DeltaWrite's outputs from the mid state: X_out, w and the read of X_out with A."""
    X_out, w = delta_update(X_mid, h, beta, v, k_eps)
    return X_out, w, state_read(X_out, A)


# DeltaWrite's 16 cases (a stored state or the repeated embedding, (d_v, taps), dtype; 2-12 s each under the
# interpreter): (4, 4) and (3, 3) in both dtypes, each other shape in one (a dtype changes only the loads and
# stores, which every other op's tests run in both); make test-fast keeps four, one of each d_v shape, taps
# count and dtype.
WRITE_SHAPES = {(1, 4): [torch.bfloat16], (2, 4): [torch.float32], (4, 4): DTYPES, (8, 4): [torch.bfloat16],
                (4, 1): [torch.float32], (3, 3): DTYPES}
WRITE_FAST = {(False, 4, 4, torch.bfloat16), (True, 1, 4, torch.bfloat16), (False, 4, 1, torch.float32),
              (False, 3, 3, torch.float32)}
WRITE_CASES = [pytest.param(repeated, dv, taps, dtype,
                            id=f"{'repeated_embedding' if repeated else 'state'}-{dv}-{taps}-{dtype}",
                            marks=() if (repeated, dv, taps, dtype) in WRITE_FAST else pytest.mark.slow)
               for repeated in (False, True) for (dv, taps), dtypes in WRITE_SHAPES.items() for dtype in dtypes]


@pytest.mark.parametrize("repeated, dv, taps, dtype", WRITE_CASES)
def test_write_matches_the_plain_update_and_read(repeated, dv, taps, dtype):
    """DeltaWrite: the mid state X + w_a k~_a^T rebuilt from its factors, updated and read with the next taps, forward
    and backward (the taps' gradient too), with and without dL/dX_out (the last block stores no state)."""
    X, h_a, w_a, h, beta, v, A = tensors(16, dtype, (B, T, dv, D), (B, T, D), (B, T, dv), (B, T, D), (B, T, 1),
                                         (B, T, dv), (dv, D, taps), positive=(4,))
    w_a, A = w_a.float(), A.float()
    if repeated:
        X = X[:, :, :1].expand(B, T, dv, D)
    G, g_w, g_next = tensors(17, dtype, (B, T, dv, D), (B, T, dv), (B, T, D))
    X_mid = X.double() + w_a.double().unsqueeze(-1) * h_a.double().unsqueeze(-2)
    (X_out, w, x_next), grads = reference(write_plain, [X_mid, h, beta, v, A], [G, g_w, g_next], k_eps=K_EPS)
    got_X, got_w, rho, q, got_x = ops.write_forward(X, h_a, w_a, h, beta, v, A, K_EPS ** 2, True)
    for name, a, b in (("X_out", got_X, X_out), ("w", got_w, w), ("x_next", got_x, x_next)):
        assert_near(a, b, name)
    assert got_x.dtype == got_w.dtype == torch.float32 and got_X.dtype == dtype
    assert ops.write_forward(X, h_a, w_a, h, beta, v, A, K_EPS ** 2, False)[0].numel() == 0
    # backward from the forward's own (fp32) rho and q
    for cotangent, expected in ((G, grads), (None, reference(write_plain, [X_mid, h, beta, v, A], [0 * G, g_w, g_next],
                                                               k_eps=K_EPS)[1])):
        got = ops.write_backward(cotangent, g_w, g_next.float(), X, h_a, w_a, h, beta, v, rho, q, A)
        for name, a, b in zip(("X_mid", "k~", "beta", "v", "A"), got, expected, strict=True):
            assert_near(a, b, f"dL/d{name} (dL/dX_out {'given' if cotangent is not None else 'absent'})")


def update_steps_plain(X, *steps, k_eps):
    """delta_update_steps on flat (k~_1, beta_1, v_1, k~_2, ...) -> (X_S, w stacked by step (B,T,S,dv))."""
    X, ws = delta_update_steps(X, list(zip(steps[0::3], steps[1::3], steps[2::3], strict=True)), k_eps)
    return X, torch.stack(ws, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dv", [1, 4])
def test_update_steps_match_the_plain_form(dv, dtype):
    """A DeltaProduct sublayer's S = 3 updates in one kernel: X_S and each step's w, and the gradients of
    X and every step's k~, beta, v, against the plain steps one after another."""
    S = 3
    X, *steps = tensors(13, dtype, (B, T, dv, D), *[(B, T, D), (B, T, 1), (B, T, dv)] * S, positive=(2, 5, 8))
    G, g_w = tensors(14, dtype, (B, T, dv, D), (B, T, S, dv))
    h, beta, v = steps[0::3], steps[1::3], steps[2::3]
    (X_new, w), grads = reference(update_steps_plain, [X, *steps], [G, g_w], k_eps=K_EPS)
    out = ops.update_steps_forward(X, h, beta, v, K_EPS ** 2)
    for name, a, b in zip(("X_S", "w"), out[:2], (X_new, w), strict=True):
        assert_near(a, b, name)
    # rho and q as the forward saves them, from the float64 steps, in fp32 (see test_update_matches_the_plain_form)
    as_float64 = [[t.double() for t in step_inputs] for step_inputs in (h, beta, v)]
    _, _, rho, q = eager.update_steps_forward(X.double(), *as_float64, K_EPS ** 2)
    got = ops.update_steps_backward(G, g_w, X, h, beta, v, rho.float(), q.float())
    assert_near(got[0], grads[0], "dL/dX")
    for n, name in enumerate(("k~", "beta", "v")):
        stacked = got[n + 1] if name != "beta" else got[n + 1].unsqueeze(-1)
        for s in range(S):
            assert_near(stacked[:, :, s], grads[1 + 3 * s + n], f"dL/d{name} of step {s + 1}")


def check_depthwise_op(forward, backward, plain, inputs, seed):
    """forward(*inputs) equals plain(*inputs), and backward(g, *inputs) its inputs' gradients."""
    out = forward(*inputs)
    g, = tensors(seed, out.dtype, out.shape)
    (expected,), grads = reference(plain, inputs, [g])
    assert_near(out, expected, "value")
    for n, (a, b) in enumerate(zip(backward(g, *inputs), grads, strict=True)):
        assert_near(a, b, f"gradient of input {n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dv", DVS)
@pytest.mark.parametrize("taps", [4, 1])                      # the time-conv compressor; the channel conv
def test_state_read_matches_the_plain_form(taps, dv, dtype):
    X, A = tensors(3, dtype, (B, T, dv, D), (D, dv, taps))
    # A as a transposed view, as the model passes it
    check_depthwise_op(ops.read_forward, ops.read_backward, state_read, [X, A.transpose(0, 1)], 4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dv, taps", [(1, 4), (2, 4), (4, 4), (8, 4), (4, 1), (1, 6)])  # 6: EC's composed read
def test_rank_one_read_matches_the_plain_form(dv, taps, dtype):
    w, h, A = tensors(5, dtype, (B, T, dv), (B, T, D), (dv, D, taps))
    check_depthwise_op(ops.rank_one_forward, ops.rank_one_backward, rank_one_read, [w, h, A], 6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dv", DVS)
def test_expansion_matches_the_plain_form(dv, dtype):
    x, E = tensors(7, dtype, (B, T, D), (dv, D, 3))
    check_depthwise_op(ops.expand_forward, ops.expand_backward, expand_state, [x, E], 8)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])   # the linear estimator, k-Map; the MLP's
@pytest.mark.parametrize("nc, nx", [(1, 4), (2, 16), (0, 1), (1, 0)])     # gates of 1 or 2 steps; v-Map has no x map
def test_norm_projections_match_the_plain_form(nc, nx, gated, dtype):
    """A sublayer's RMSNorm and its gates in one row kernel: c (in the dtype asked: autocast's), y_c, y_x (activated,
    2 sigmoid(. + b_c) and 3 sigmoid(. + b_x), or the maps alone), and every gradient, the weights' and biases' summed
    over chunks of tokens."""
    x, gain, W_c, W_x = tensors(18, dtype, (B, T, D), (D,), (nc, D), (nx, D))
    gain, W_c, W_x = gain.float(), W_c.float(), W_x.float()
    b_c, b_x = (b.float() if gated else None for b in tensors(20, dtype, (nc,), (nx,)))
    g_c, g_yc, g_yx = tensors(19, dtype, (B, T, D), (B, T, nc), (B, T, nx))
    inputs = [x, gain, W_c, W_x] + ([b_c, b_x] if gated else [])

    def plain(x, g, W_c, W_x, *biases):
        return eager.norm_projections(x, g, W_c, W_x, 1e-5, *(biases or (None, None)), 2.0, 3.0)

    (c, y_c, y_x), grads = reference(plain, inputs, [g_c, g_yc, g_yx])
    for c_dtype in (torch.float32, torch.bfloat16):
        got_c, got_yc, got_yx, rho = ops.norm_forward(x, gain, W_c, W_x, b_c, b_x, 2.0, 3.0, 1e-5, c_dtype)
        assert got_c.dtype == c_dtype and got_yc.dtype == got_yx.dtype == torch.float32
        for name, a, b in (("c", got_c, c), ("y_c", got_yc, y_c), ("y_x", got_yx, y_x)):
            assert_near(a, b, name)
    got = ops.norm_backward(g_c, g_yc.float(), g_yx.float(), x, gain, W_c, W_x, b_c, b_x, 2.0, 3.0, rho, got_yc, got_yx)
    names = ("x", "g", "W_c", "W_x", "b_c", "b_x")[:len(grads)]
    for name, a, b in zip(names, got[:len(grads)], grads, strict=True):
        assert_near(a, b, f"dL/d{name}")
    if not gated:
        assert got[4].numel() == got[5].numel() == 0


def test_sums_over_tokens_follow_the_token_order_bit_for_bit(monkeypatch):
    """The taps' gradients: partials of TOKENS_PER_CHUNK (TOKENS_PER_TILE) tokens each, summed in chunk order, the same
    bits on every run (here chunks of 5 and tiles of 4 tokens, the last one short)."""
    monkeypatch.setattr(triton_loops, "TOKENS_PER_CHUNK", 5)
    monkeypatch.setattr(triton_loops, "TOKENS_PER_TILE", 4)
    dv = 2
    X, A, w, h, x = tensors(9, torch.float32, (B, T, dv, D), (dv, D, 4), (B, T, dv), (B, T, D), (B, T, D))
    g_x, g_X = tensors(10, torch.float32, (B, T, D), (B, T, dv, D))
    for backward, inputs, plain, g in ((ops.read_backward, [X, A], state_read, g_x),
                                       (ops.rank_one_backward, [w, h, A], rank_one_read, g_x),
                                       (ops.expand_backward, [x, A], expand_state, g_X)):
        first, again = backward(g, *inputs), backward(g, *inputs)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True)), backward
        for a, b in zip(first, reference(plain, inputs, [g])[1], strict=True):
            assert_near(a, b, str(backward))


def test_a_tiled_op_gives_the_same_numbers_at_any_features_a_tile(monkeypatch):
    """Each op with a tiled kernel at 32 features a tile (three feature blocks at d = 80, the last short) and at the
    default's: the same outputs up to the order of the blocks' partial sums (make gpu-check's kernels part times the
    ops at other tile sizes)."""
    def outputs(name: str) -> tuple:
        out = getattr(ops, name)(*calls[name])
        return out if isinstance(out, tuple) else (out,)

    calls = triton_compile.op_calls(D, 4, 3, device=DEVICE, tokens=T)
    assert triton_loops.TILE_FEATURES > 32                  # the default covers d = 80 in fewer, wider blocks
    default = {name: outputs(name) for name in triton_loops.TILED_OPS}
    monkeypatch.setattr(triton_loops, "TILE_FEATURES", 32)
    for name in triton_loops.TILED_OPS:
        for n, (a, b) in enumerate(zip(outputs(name), default[name], strict=True)):
            assert_near(a, b.double(), f"{name} output {n}")


def test_the_ops_declare_their_outputs_for_torch_compile():
    """Each op's schema, and on CUDA its fake (its own body, run on fake tensors), match what it returns.
    (Under the interpreter torch's wrap_triton launches a kernel even on fake tensors.)"""
    for name, args in triton_compile.op_calls(8, 2, 3, device=DEVICE).items():
        checks = ("test_schema", "test_faketensor") if DEVICE.type == "cuda" else ("test_schema",)
        result = torch.library.opcheck(getattr(ops, name.split()[0]).default, args, test_utils=checks)
        assert set(result.values()) == {"SUCCESS"}, (name, result)


@pytest.mark.slow
def test_every_kernel_compiles_for_an_h100():
    """Each kernel as the ops launch it (fp32 and bf16, d_v = 1 and 4) compiles to an H100's code with triton's own
    compiler and ptxas, no GPU needed (ddl/model/fused/triton_compile.py): what the interpreter cannot show, a kernel
    it runs that the GPU's compiler refuses. (On a GPU every test here compiles what it runs.)"""
    if DEVICE.type == "cuda":
        pytest.skip("on a GPU the kernels compile as the other tests launch them")

    def every_call():
        for dtype in DTYPES:
            for dv in (1, 4):
                triton_compile.launch_all(triton_compile.op_calls(8, dv, 3, dtype))

    launches = triton_compile.record(every_call)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "ddl.model.fused.triton_compile", "--compile", "--warps", "4"],
                            input=json.dumps(launches), capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    failed = [row for row in json.loads(result.stdout.splitlines()[-1]) if "error" in row]
    assert not failed, f"of {len(launches)} launches, these do not compile for sm_90: {failed}"


@pytest.mark.slow
def test_the_compile_report_lists_each_kernel_with_its_registers():
    """`python -m ddl.model.fused.triton_compile` at a small shape: every kernel of triton_loops in its table, each
    with registers and stack, and exit 0."""
    if DEVICE.type == "cuda":
        pytest.skip("a CPU machine's command (on a GPU, make gpu-check times the kernels)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "ddl.model.fused.triton_compile", "--d", "48", "--dv", "2",
                             "--taps", "3", "--warps", "4"], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| _")]
    kernels = {name for name, k in vars(triton_loops).items() if name.endswith("_kernel") and callable(k)}
    assert {row[0].removeprefix("| ") for row in rows} == kernels
    assert all(int(row[3]) > 0 and int(row[4].removesuffix(" |")) >= 0 for row in rows), rows


def test_the_compile_report_refuses_a_bad_value_in_its_error_line():
    """A warps count that is no power of two, a width that is no integer, a newline in a list: exit 2 before anything
    runs, the error line naming the argument, the value and what is allowed."""
    for argument, allowed in (("--warps=0", "powers of two from 1 to 32"), ("--d=nan", "an integer >= 1"),
                              ("--warps=4,\n8", "powers of two from 1 to 32")):
        result = subprocess.run([sys.executable, "-m", "ddl.model.fused.triton_compile", argument], capture_output=True,
                                text=True, timeout=120)
        line = result.stderr.strip().splitlines()[-1]
        name, value = argument.split("=")
        assert result.returncode == 2 and f"argument {name}: {value!r}: must be" in line and allowed in line, line
        assert result.stdout == ""


def loss_and_grads(**kw) -> tuple:
    torch.manual_seed(0)
    model = GPT(model_config("micro", vocab_size=64, d_model=80, residual="ddl", state_dtype="fp32",  # d = 80: masks
                             **kw)).to(DEVICE)
    idx = torch.randint(0, 64, (2, 7), generator=generator(12)).to(DEVICE)
    _, loss = model(idx, idx.roll(-1, 1))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


# Each way the model routes its state into the ops; d_v = 2 and 8 take d_v = 4's route (each op's own tests run
# every d_v).
MODEL_VARIANTS = {"dv1": dict(dv=1), "dv1_vmap": dict(dv=1, mapping="v"), "dv4": dict(dv=4),
                  "dv4_vmap": dict(dv=4, mapping="v"), "cc": dict(dv=4, conv="cc"),
                  "ec": dict(dv=4, conv="ec"), "cc_ec": dict(dv=4, conv="cc_ec"),
                  "mlp_gate": dict(dv=4, beta_estimator="mlp", beta_hidden=40), "nh2": dict(dv=4, n_h=2),
                  "dv1_nh2": dict(dv=1, n_h=2), "mup": dict(dv=4, param="mup", mup_base_width=40)}


FAST_VARIANTS = ("dv4", "ec")                                 # the rest: slow (the interpreter, 20 s each)


@pytest.mark.parametrize("variant", [pytest.param(v, id=name, marks=() if name in FAST_VARIANTS else pytest.mark.slow)
                                     for name, v in MODEL_VARIANTS.items()])
def test_the_model_with_the_triton_loops_gives_the_numbers_of_the_others(variant, monkeypatch):
    """The whole model (d = 80), fp32, forward and backward, every variant: the Triton loops against the C++ ones on
    CPU (routed there by hand: dispatch picks Triton only on CUDA), against the PyTorch-op loops on CUDA."""
    if DEVICE.type == "cuda":
        assert fused.loops_name(torch.empty(0, device=DEVICE)) == "Triton"
        with_triton = loss_and_grads(**variant)
        monkeypatch.setattr(fused.native, "ENABLED", False)
    else:
        real_loops_for = fused.loops_for
        monkeypatch.setattr(fused, "loops_for", lambda t: ops if t.dtype != torch.float64 else real_loops_for(t))
        with_triton = loss_and_grads(**variant)
        monkeypatch.undo()
    others = loss_and_grads(**variant)
    torch.testing.assert_close(with_triton[0], others[0], rtol=1e-5, atol=1e-5)
    for name, grad in others[1].items():
        torch.testing.assert_close(with_triton[1][name], grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
