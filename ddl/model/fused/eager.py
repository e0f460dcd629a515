"""The fused ops' loops as PyTorch ops, for any device: what cpu.cpp does on CPU, op by op.

The same functions and signatures as cpu.cpp's ops (its header has the symbols), each a few
passes of dot products and multiply-adds, run with autocast off (`exact`: they compute in the dtypes they are given,
as the C++ and Triton ops do); and norm_projections, the plain form of that fused op, with its gates' activation
(gate), which autocast applies to as to any of the model's ops.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F


def autocast_off(device: str):
    """torch.autocast(device, enabled=False) where autocast is on, else nothing to leave: entering one costs tens of
    microseconds, a dispatch-bound step's worth over its hundreds of op calls."""
    return torch.autocast(device, enabled=False) if torch.is_autocast_enabled(device) else _NOTHING


_NOTHING = contextlib.nullcontext()


def exact(op):
    """op as the C++ ops run: its tensors (and lists of them) cast to the computing dtype, its first tensor's at least
    fp32, and autocast off where it is on (it would recast the matmuls)."""
    @functools.wraps(op)
    def run(*args):
        first = next(a for a in args if isinstance(a, torch.Tensor))
        acc = torch.promote_types(first.dtype, torch.float32)

        def computed(a):
            if isinstance(a, (list, tuple)):
                return [computed(t) for t in a]
            return a.to(acc) if isinstance(a, torch.Tensor) else a

        with autocast_off(first.device.type):
            return op(*(computed(a) for a in args))
    return run


@exact
def update_forward(X, h, beta, v, eps2: float):
    """X (B,T,dv,d), h = k~ (B,T,d), beta (B,T,1), v (B,T,dv) -> X + w k~^T, w, rho, q = X k~."""
    k = h.unsqueeze(-2)                                                          # (B,T,1,d)
    rho = torch.rsqrt(torch.linalg.vecdot(h, h).unsqueeze(-1) + eps2)           # 1 / sqrt(|k~|^2 + eps^2)
    q = torch.linalg.vecdot(X, k)                                                # (B,T,dv)
    w = write_coefficient(beta, rho, v, q)
    return torch.addcmul(X, w.unsqueeze(-1), k), w, rho, q


def write_coefficient(beta, rho, v, q):
    """w = beta rho (v - rho q): the write's coefficients, in the forward and where a backward recomputes them."""
    return beta * rho * (v - rho * q)


@exact
def update_backward(G, g_w, X, h, beta, v, rho, q):
    """Gradients of update_forward's (X_new, w) for X, h, beta, v, given G = dL/dX_new, g_w = dL/dw or None."""
    k = h.unsqueeze(-2)
    g_w = torch.linalg.vecdot(G, k) if g_w is None else torch.linalg.vecdot(G, k) + g_w
    res = v - rho * q                                                            # v - k^T X
    g_res = g_w * beta * rho                                                     # = dL/dv
    g_q = -g_res * rho
    g_beta = (g_w * rho * res).sum(-1, keepdim=True)
    g_rho = (g_w * beta * res - g_res * q).sum(-1, keepdim=True)
    g_X = torch.addcmul(G, g_q.unsqueeze(-1), k)
    g_h = h * (-g_rho * rho ** 3)                                                # through rho: -rho^3 k~
    for j in range(X.size(-2)):                                                  # sum_j w_j G_j + g_q_j X_j
        g_h.addcmul_(G[..., j, :], beta * rho * res[..., j:j + 1]).addcmul_(X[..., j, :], g_q[..., j:j + 1])
    return g_X, g_h, g_beta, g_res


@exact
def key_forward(X, h, beta, v, eps2: float):
    """update_forward without its new state: w, rho, q (the attention's update, whose state only its handle carries)."""
    rho = torch.rsqrt(torch.linalg.vecdot(h, h).unsqueeze(-1) + eps2)
    q = torch.linalg.vecdot(X, h.unsqueeze(-2))
    return write_coefficient(beta, rho, v, q), rho, q


def mid_state(X, h_a, w_a):
    """X + w_a k~_a^T: the state between a block's two updates, rebuilt from the block's input and the first write."""
    return torch.addcmul(X, w_a.unsqueeze(-1), h_a.unsqueeze(-2))


@exact
def write_forward(X, h_a, w_a, h, beta, v, A, eps2: float, store_state: bool):
    """The MLP's update of the mid state X + w_a k~_a^T and the next read of its result: X_out (empty when not
    store_state), w, rho, q, and x_next = read_forward(X_out, A)."""
    X_out, w, rho, q = update_forward(mid_state(X, h_a, w_a), h, beta, v, eps2)
    return X_out if store_state else X_out.new_empty(0), w, rho, q, read_forward(X_out, A)


@exact
def write_backward(G, g_w, g_next, X, h_a, w_a, h, beta, v, rho, q, A):
    """Gradients of write_forward's (X_out, w, x_next), G = dL/dX_out (None: not stored): dL/dX_mid, dL/dk~,
    dL/dbeta, dL/dv and dL/dA."""
    X_mid = mid_state(X, h_a, w_a)
    X_out = torch.addcmul(X_mid, write_coefficient(beta, rho, v, q).unsqueeze(-1), h.unsqueeze(-2))
    g_read, g_A = read_backward(g_next, X_out, A)
    G_mid, g_h, g_beta, g_v = update_backward(g_read if G is None else G + g_read, g_w, X_mid, h, beta, v, rho, q)
    return G_mid, g_h, g_beta, g_v, g_A


@exact
def update_steps_forward(X, h, beta, v, eps2: float):
    """The S updates of a sublayer in turn, step s's k~, beta, v = h[s], beta[s], v[s]: X_S and each step's
    w, rho, q stacked by step, (B,T,S,dv), (B,T,S), (B,T,S,dv)."""
    by_step = []
    for step in zip(h, beta, v, strict=True):
        X, *w_rho_q = update_forward(X, *step, eps2)
        by_step.append(w_rho_q)
    w, rho, q = (torch.stack(t, 2) for t in zip(*by_step, strict=True))
    return X, w, rho.squeeze(-1), q


@exact
def update_steps_backward(G, g_w, X, h, beta, v, rho, q):
    """Gradients of update_steps_forward's (X_S, w) for X and each step's k~, beta, v (stacked by step, as w):
    the states X_1 .. X_{S-1} recomputed from X, then each step's backward in reverse."""
    rho = rho.unsqueeze(-1)
    states = [X]
    for s in range(len(h) - 1):                                                  # X_s = X_{s-1} + w_s k~_s^T
        w = write_coefficient(beta[s], rho[:, :, s], v[s], q[:, :, s])
        states.append(torch.addcmul(states[-1], w.unsqueeze(-1), h[s].unsqueeze(-2)))
    grads = []
    for s in reversed(range(len(h))):
        G, *step_grads = update_backward(G, None if g_w is None else g_w[:, :, s], states[s], h[s], beta[s], v[s],
                                         rho[:, :, s], q[:, :, s])
        grads.append(step_grads)
    g_h, g_beta, g_v = (torch.stack(t[::-1], 2) for t in zip(*grads, strict=True))
    return G, g_h, g_beta.squeeze(-1), g_v


@exact
def read_forward(X, A):
    """x[t] = sum over lag, j of A[j, :, L-1-lag] * X[t-lag, j, :]; X (B,T,dv,d), A (dv,d,L) -> (B,T,d)."""
    T, dv, L = X.size(1), X.size(2), A.size(-1)
    x = torch.mul(X[:, :, 0], A[0, :, L - 1])
    for lag in range(min(L, T)):
        for j in range(dv):
            if lag or j:
                x[:, lag:].addcmul_(X[:, : T - lag, j], A[j, :, L - 1 - lag])
    return x


@exact
def read_backward(g, X, A):
    """Shifts the (B,T,d) gradient instead of slicing the state: every pass over the state is contiguous."""
    B, T, dv, d = X.shape
    L = A.size(-1)
    g_ahead = [_ahead(g, lag).unsqueeze(2) for lag in range(min(L, T))]          # g[t + lag] at t
    g_X, product = (torch.empty(B, T, dv, d, dtype=X.dtype, device=X.device) for _ in range(2))  # contiguous
    torch.mul(g_ahead[0], A[..., L - 1], out=g_X)
    for lag in range(1, len(g_ahead)):
        g_X.addcmul_(g_ahead[lag], A[..., L - 1 - lag])
    g_A = torch.zeros_like(A)
    for lag, g_lag in enumerate(g_ahead):
        g_A[..., L - 1 - lag] = torch.mul(X, g_lag, out=product).view(B * T, dv * d).sum(0).view(dv, d)
    return g_X, g_A


@exact
def rank_one_forward(w, h, A):
    """read_forward of the rank-1 state w k~^T from its factors w (B,T,dv), h = k~ (B,T,d)."""
    T, L = w.size(1), A.size(-1)
    x = (w @ A[..., L - 1]) * h
    for lag in range(1, min(L, T)):
        x[:, lag:].addcmul_(w[:, : T - lag] @ A[..., L - 1 - lag], h[:, : T - lag])
    return x


@exact
def rank_one_backward(g, w, h, A):
    dv, d, L = A.shape
    g_w, g_h, g_A = torch.zeros_like(w), torch.zeros_like(h), torch.zeros_like(A)
    for lag in range(min(L, w.size(1))):
        g_lag, A_lag = _ahead(g, lag), A[..., L - 1 - lag]                       # source token t feeds t + lag
        g_h.addcmul_(g_lag, w @ A_lag)
        g_P = g_lag * h
        g_w += g_P @ A_lag.T
        g_A[..., L - 1 - lag] = w.reshape(-1, dv).T @ g_P.reshape(-1, d)
    return g_w, g_h, g_A


@exact
def expand_forward(x, E):
    """X[t, j] = sum over lag of E[j, :, L-1-lag] * x[t-lag]; x (B,T,d), E (dv,d,L) -> (B,T,dv,d)."""
    T, L = x.size(1), E.size(-1)
    X = x.unsqueeze(2) * E[..., L - 1]
    for lag in range(1, min(L, T)):
        X[:, lag:].addcmul_(x[:, : T - lag].unsqueeze(2), E[..., L - 1 - lag])
    return X


@exact
def expand_backward(g, x, E):
    dv, d, L = E.shape
    g_x, g_E = torch.zeros_like(x), torch.zeros_like(E)
    for lag in range(min(L, x.size(1))):
        g_lag = _ahead(g, lag)                                                   # x[t] feeds the state at t + lag
        for j in range(dv):
            g_x.addcmul_(g_lag[:, :, j], E[j, :, L - 1 - lag])
            g_E[j, :, L - 1 - lag] = torch.linalg.vecdot(g_lag[:, :, j].reshape(-1, d).T, x.reshape(-1, d).T)
    return g_x, g_E


def norm_projections(x, weight, W_c, W_x, eps: float, b_c=None, b_x=None, s_c: float = 1.0, s_x: float = 1.0):
    """(c, gate(c W_c^T, b_c, s_c), gate(x W_x^T, b_x, s_x)) with c = rms_norm(x) * weight: the plain form, which
    autograd differentiates."""
    c = F.rms_norm(x, x.shape[-1:], weight.to(x.dtype), eps)
    return c, gate(F.linear(c, W_c), b_c, s_c), gate(F.linear(x, W_x), b_x, s_x)


def gate(l, b, s: float):
    """A gate's activation of its map l: s sigmoid(l + b) in at least fp32 where it has biases b (beta = 2 sigmoid(.),
    v = s sigmoid(.)), else l itself (b None: the MLP estimator's hidden layer)."""
    return l if b is None else s * torch.sigmoid(l.to(torch.promote_types(l.dtype, torch.float32)) + b)


def _ahead(g: torch.Tensor, lag: int) -> torch.Tensor:
    """g[:, t + lag] at position t, zero past the end: (B,T,...) -> the same shape, contiguous."""
    return F.pad(g[:, lag:], (0, 0) * (g.dim() - 2) + (0, lag)) if lag else g
