"""The Delta operator's algebra (paper sections 2-3), checked numerically in float64."""

import math

import pytest
import torch
import torch.nn.functional as F

from ddl.model import delta_update
from ddl.model.delta import delta_key, expand_state, rank_one_read, state_read
from ddl.model.fused import (FusedExpand, FusedRankOneRead, FusedStateRead, eager, fused_key, fused_update,
                             loops_for, native, norm_projections)

D, DV = 16, 4
K_EPS = 1e-5


pytestmark = pytest.mark.usefixtures("float64_default")   # tests/conftest.py


def unit(d=D, seed=0):
    k = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return k / k.norm()


def operator(beta, k):
    return torch.eye(k.numel()) - beta * torch.outer(k, k)  # A = I - beta k k^T (Eq. 2.3)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0, 1.7, 2.0])
def test_spectrum_and_determinant(beta):
    k = unit()
    A = operator(beta, k)
    eig = torch.linalg.eigvalsh(A)
    expected = torch.tensor(sorted([1.0] * (D - 1) + [1.0 - beta]))
    assert torch.allclose(eig, expected, atol=1e-12)
    assert torch.allclose(A @ k, (1 - beta) * k)                       # k is the (1-beta) eigenvector
    assert math.isclose(torch.linalg.det(A).item(), 1 - beta, abs_tol=1e-12)
    lifted = torch.kron(torch.eye(DV), A)                                # I_dv (x) A on vec(X)
    assert math.isclose(torch.linalg.det(lifted).item(), (1 - beta) ** DV, abs_tol=1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 1.5, 2.0])
def test_orthogonal_iff_beta_is_0_or_2(beta):
    A = operator(beta, unit())
    orthogonal = torch.allclose(A.T @ A, torch.eye(D), atol=1e-12)
    assert orthogonal == (beta in (0.0, 2.0))


def test_beta_two_is_an_involution():
    A = operator(2.0, unit())
    assert torch.allclose(A @ A, torch.eye(D), atol=1e-12)


def random_state(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(D, DV, generator=g), torch.randn(DV, generator=g)


@pytest.mark.parametrize("beta", [0.2, 1.0, 1.9])
def test_operator_form_equals_delta_form_and_projection(beta):
    k = unit()
    X, v = random_state()
    eq_2_4 = operator(beta, k) @ X + beta * torch.outer(k, v)
    eq_2_5 = X + beta * torch.outer(k, v - k @ X)
    assert torch.allclose(eq_2_4, eq_2_5, atol=1e-12)
    # Eq. 2.6: k^T X_{l+1} = (1 - beta) k^T X_l + beta v^T
    assert torch.allclose(k @ eq_2_5, (1 - beta) * (k @ X) + beta * v, atol=1e-12)
    # the implemented update (batched, normalising any positive multiple k~ of k) is the same map
    out, _ = delta_update(X.T[None, None], 3 * k[None, None], torch.tensor([[[beta]]]), v[None, None], 0.0)
    assert torch.allclose(out[0, 0].T, eq_2_5, atol=1e-12)                # the state is stored as dv x d


def test_beta_one_overwrites_the_k_component_and_keeps_the_rest():
    k = unit()
    X, v = random_state()
    out = X + torch.outer(k, v - k @ X)
    assert torch.allclose(k @ out, v, atol=1e-12)
    orth = torch.eye(D) - torch.outer(k, k)
    assert torch.allclose(orth @ out, orth @ X, atol=1e-12)


@pytest.fixture(params=["native", "eager"])
def loops(request, monkeypatch):
    """Each fused op's loops: the C++ build (which must have built here) and the PyTorch-op twin."""
    monkeypatch.setattr(native, "ENABLED", request.param == "native")
    assert (loops_for(torch.zeros(1)) is eager) == (request.param == "eager")
    return request.param


def update_inputs(dv, seed=2, B=2, T=3):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, T, dv, D, generator=g)
    k_raw = torch.randn(B, T, D, generator=g)                                   # normalised by the update
    beta = 2 * torch.rand(B, T, 1, generator=g)
    v = torch.rand(B, T, dv, generator=g)
    return [t.requires_grad_() for t in (X, k_raw, beta, v)]


@pytest.mark.parametrize("dv", [1, DV])
def test_fused_update_matches_the_plain_one_in_value_and_gradient(dv, loops):
    plain_in, fused_in = update_inputs(dv), update_inputs(dv)
    plain = delta_update(*plain_in, K_EPS)                                      # (new state, w)
    fused = fused_update(*fused_in, K_EPS)
    g = torch.Generator().manual_seed(3)
    weights = [torch.randn(out.shape, generator=g) for out in plain]            # a loss on both outputs
    for outputs in (plain, fused):
        sum((out * w).sum() for out, w in zip(outputs, weights, strict=True)).backward()
    for a, b in zip(plain, fused, strict=True):
        assert torch.allclose(a, b, atol=1e-12)
    for name, a, b in zip(("X", "k_raw", "beta", "v"), plain_in, fused_in, strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-12), name
    assert torch.autograd.gradcheck(lambda *t: fused_update(*t, K_EPS), update_inputs(dv))


def test_fused_update_keeps_the_state_in_fp32_under_bf16_autocast(loops):
    inputs = [t.detach().float() for t in update_inputs(DV)]
    plain, _ = fused_update(*inputs, K_EPS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast, _ = fused_update(*inputs, K_EPS)
    assert autocast.dtype == torch.float32 and torch.equal(autocast, plain)


@pytest.mark.parametrize("used", ["every output", "w alone"])
def test_delta_key_matches_the_plain_update_and_read_in_value_and_gradient(used, loops):
    """fused_key (w, the mid state's handle, x_in + the read of the write) against delta_key, which returns the mid
    state itself: the handle's gradient is the mid state's, so a loss on either gives the inputs the same gradients."""
    g = torch.Generator().manual_seed(9)
    x_in, A = torch.randn(2, 3, D, generator=g), torch.randn(DV, D, 4, generator=g)
    plain_in, fused_in = ([*update_inputs(DV), x_in.clone().requires_grad_(), A.clone().requires_grad_()]
                          for _ in range(2))
    plain, fused = delta_key(*plain_in, K_EPS), fused_key(*fused_in, K_EPS)
    assert torch.allclose(fused[0], plain[0], atol=1e-12) and torch.allclose(fused[2], plain[2], atol=1e-12)
    weights = [torch.randn(out.shape, generator=g) for out in plain]
    used_outputs = 3 if used == "every output" else 1
    for outputs in (plain, fused):
        sum((out * w).sum() for out, w in zip(outputs[:used_outputs], weights, strict=False)).backward()
    for name, a, b in zip(("X", "k_raw", "beta", "v", "x_in", "A"), plain_in, fused_in, strict=True):
        assert (a.grad is None) == (b.grad is None), name
        assert a.grad is None or torch.allclose(a.grad, b.grad, atol=1e-12), name


def assert_fused_matches_plain(plain, fused, inputs, g):
    """fused(*inputs) equals plain(*inputs) in value and in every input's gradient, and passes gradcheck."""
    plain_in, fused_in = ([t.clone().requires_grad_() for t in inputs] for _ in range(2))
    expected, out = plain(*plain_in), fused(*fused_in)
    assert torch.allclose(out, expected, atol=1e-12)
    G = torch.randn(expected.shape, generator=g)
    expected.backward(G), out.backward(G)
    for a, b in zip(plain_in, fused_in, strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-12)
    assert torch.autograd.gradcheck(fused, [t.clone().requires_grad_() for t in inputs])


@pytest.mark.parametrize("taps, T", [(4, 6), (4, 2), (1, 5)])
def test_fused_state_read_matches_the_plain_one_in_value_and_gradient(taps, T, loops):
    g = torch.Generator().manual_seed(5)
    X, A = torch.randn(2, T, DV, D, generator=g), torch.randn(DV, D, taps, generator=g)
    assert_fused_matches_plain(state_read, FusedStateRead.apply, [X, A], g)


@pytest.mark.parametrize("taps, T", [(4, 6), (4, 2), (1, 5)])
def test_reading_a_rank_one_write_from_its_factors(taps, T, loops):
    g = torch.Generator().manual_seed(7)
    w, k_raw = torch.randn(2, T, DV, generator=g), torch.randn(2, T, D, generator=g)
    A = torch.randn(DV, D, taps, generator=g)
    written = w.unsqueeze(-1) * k_raw.unsqueeze(-2)                             # the write, materialised
    assert torch.allclose(rank_one_read(w, k_raw, A), state_read(written, A), atol=1e-12)
    assert_fused_matches_plain(rank_one_read, FusedRankOneRead.apply, [w, k_raw, A], g)


@pytest.mark.parametrize("taps, T", [(4, 6), (4, 2), (1, 5)])
def test_fused_expansion_is_the_depthwise_conv_over_time(taps, T, loops):
    g = torch.Generator().manual_seed(8)
    x, E = torch.randn(2, T, D, generator=g), torch.randn(DV, D, taps, generator=g)
    weight = E.transpose(0, 1).reshape(D * DV, 1, taps)                         # channel i*dv + j, as EmbedExpander
    conv = F.conv1d(F.pad(x.transpose(1, 2), (taps - 1, 0)), weight, groups=D)  # (B, d*dv, T)
    assert torch.allclose(expand_state(x, E), conv.transpose(1, 2).reshape(2, T, D, DV).mT, atol=1e-12)
    assert_fused_matches_plain(expand_state, FusedExpand.apply, [x, E], g)


# The sublayer's gates: the linear estimator and the k-Map (beta and v activated in the op), DeltaProduct's two steps
# side by side, the MLP estimator's hidden layer with the k-Map's v, the MLP estimator and the v-Map (no activation).
@pytest.mark.parametrize("n_c, n_x, gated", [(1, DV, "cx"), (2, 2 * DV, "cx"), (8, DV, "x"), (8, 0, "")])
def test_fused_norm_with_its_gates_matches_the_plain_ops(n_c, n_x, gated, loops):
    g = torch.Generator().manual_seed(10)
    x, weight = torch.randn(2, 5, D, generator=g), 1 + 0.1 * torch.randn(D, generator=g)
    W_c, W_x = torch.randn(n_c, D, generator=g), torch.randn(n_x, D, generator=g)
    b_c, b_x = torch.randn(n_c, generator=g), torch.randn(n_x, generator=g)
    inputs = [x, weight, W_c, W_x] + [b_c] * ("c" in gated) + [b_x] * ("x" in gated)
    names = ["x", "weight", "W_c", "W_x"] + ["b_c"] * ("c" in gated) + ["b_x"] * ("x" in gated)

    def norm(norm_projections, x, weight, W_c, W_x, *biases):
        b_c = biases[0] if "c" in gated else None
        b_x = biases[-1] if "x" in gated else None
        return norm_projections(x, weight, W_c, W_x, 1e-6, b_c, b_x, 2.0, 3.0)

    def loss(norm_projections, *tensors):                                       # every output feeds the loss
        c, y_c, y_x = norm(norm_projections, *tensors)
        return (c * x.cos()).sum() + y_c.pow(2).sum() + y_x.sin().sum()

    plain_in, fused_in = ([t.clone().requires_grad_() for t in inputs] for _ in range(2))
    expected, out = loss(eager.norm_projections, *plain_in), loss(norm_projections, *fused_in)
    assert torch.allclose(out, expected, atol=1e-12)
    expected.backward(), out.backward()
    for name, a, b in zip(names, plain_in, fused_in, strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-12), name
    assert torch.autograd.gradcheck(lambda *t: norm(norm_projections, *t), [t.clone().requires_grad_() for t in inputs])
