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

import pytest
import torch

from ddl.model import GPT, model_config
from ddl.model import fused
from ddl.model.delta import delta_update, delta_update_steps, expand_state, rank_one_read, state_read
from ddl.model.fused import eager
from tests.conftest import TEST_DEVICE, slow_except

DEVICE = TEST_DEVICE
triton = pytest.importorskip("triton", reason="triton is not installed (a dev dependency on Linux x86_64 only)")
if DEVICE.type == "cuda" and not torch.cuda.is_available():
    pytest.skip("DDL_TEST_DEVICE=cuda, but torch sees no CUDA device", allow_module_level=True)
from ddl.model.fused import triton_loops  # noqa: E402  (registers torch.ops.ddl_triton)
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if DEVICE.type == "cpu" and not isinstance(triton_loops._update_forward_kernel, InterpretedFunction):
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


def test_sums_over_tokens_follow_the_token_order_bit_for_bit(monkeypatch):
    """The taps' gradients: partials of TOKENS_PER_CHUNK tokens each, summed in chunk order, the same
    bits on every run (here chunks of 5 tokens, the last one short)."""
    monkeypatch.setattr(triton_loops, "TOKENS_PER_CHUNK", 5)
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


def test_the_ops_declare_their_outputs_for_torch_compile():
    """Each op's schema, and on CUDA its fake (its own body, run on fake tensors), match what it returns.
    (Under the interpreter torch's wrap_triton launches a kernel even on fake tensors.)"""
    dv, d, L = 2, 8, 3
    X, h, beta, v, w, A, G, g_x = tensors(11, torch.float32, (1, 3, dv, d), (1, 3, d), (1, 3, 1), (1, 3, dv),
                                          (1, 3, dv), (dv, d, L), (1, 3, dv, d), (1, 3, d), positive=(2,))
    _, _, rho, q = ops.update_forward(X, h, beta, v, K_EPS ** 2)
    _, w_by_step, rho_by_step, q_by_step = ops.update_steps_forward(X, [h, h], [beta, beta], [v, v], K_EPS ** 2)
    calls = {"update_forward": (X, h, beta, v, K_EPS ** 2), "update_backward": (G, w, X, h, beta, v, rho, q),
             "update_steps_forward": (X, [h, h], [beta, beta], [v, v], K_EPS ** 2),
             "update_steps_backward": (G, w_by_step, X, [h, h], [beta, beta], [v, v], rho_by_step, q_by_step),
             "read_forward": (X, A), "read_backward": (g_x, X, A), "rank_one_forward": (w, h, A),
             "rank_one_backward": (g_x, w, h, A), "expand_forward": (h, A), "expand_backward": (G, h, A)}
    for name, args in calls.items():
        checks = ("test_schema", "test_faketensor") if DEVICE.type == "cuda" else ("test_schema",)
        result = torch.library.opcheck(getattr(ops, name).default, args, test_utils=checks)
        assert set(result.values()) == {"SUCCESS"}, (name, result)


def loss_and_grads(**kw) -> tuple:
    torch.manual_seed(0)
    model = GPT(model_config("micro", vocab_size=64, residual="ddl", **kw)).to(DEVICE)
    idx = torch.randint(0, 64, (2, 11), generator=generator(12)).to(DEVICE)
    _, loss = model(idx, idx.roll(-1, 1))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("variant", slow_except({"dv1": dict(dv=1), "dv4_ec": dict(dv=4, conv="ec")}, "dv1"))
def test_the_model_with_the_triton_loops_gives_the_numbers_of_the_others(variant, monkeypatch):
    """The whole micro model, fp32, forward and backward: the Triton loops against the C++ ones on CPU
    (routed there by hand: dispatch picks Triton only on CUDA), against the PyTorch-op loops on CUDA."""
    if DEVICE.type == "cuda":
        assert fused.loops_name(torch.empty(0, device=DEVICE)) == "Triton"
        with_triton = loss_and_grads(**variant)
        monkeypatch.setenv("DDL_NATIVE_KERNELS", "0")
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
