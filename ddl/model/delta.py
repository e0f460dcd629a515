"""The Deep Delta residual (paper sections 2-4, appendix B).

The paper's state X is a d x d_v matrix per token; it is stored transposed, as (B, T, d_v, d), so
that the d features are contiguous and every read and write of the state is a batched mat-vec or
a contiguous multiply-add. d_v = 1 is the vector case of Eq. 3.1 (an axis of 1).
One Delta sublayer, given the sublayer output h = F(RMSNorm(x_in)):

    k    = k~ / ||k~||          k-Map: k~ = h            v-Map: k~ = phi_k(.)
    beta = 2 sigmoid(Linear(c))  c = RMSNorm(x_in), logits in fp32
    v    = s sigmoid(W_v u)      k-Map: u = x_in         v-Map: u = h
    X   <- X + beta k (v^T - k^T X)                      (Eq. 2.5)
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


def delta_update(X: torch.Tensor, k_hat: torch.Tensor, beta: torch.Tensor, v: torch.Tensor,
                 k_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2.5, X + beta k (v^T - k^T X), with the unit direction k = k_hat * k_scale.

    Returns the new state X + delta k_hat^T and the write's values delta = beta (v - k^T X) k_scale
    (B,T,dv, at least fp32), which let a compressor read the new state cheaply (read_write).

    The plain PyTorch form: the reference that FusedDeltaUpdate (what the model runs) is tested
    against. k_hat is RMS-normalised (entries O(1)) and k_scale = 1/sqrt(d) is applied outside
    the dot products, which keeps bf16 precision (paper 4.1, "precision-friendly normalization").
    X (B,T,dv,d), k_hat (B,T,d), beta (B,T,1) fp32, v (B,T,dv).
    """
    acc = _at_least_fp32(X.dtype)
    proj = (X * k_hat.unsqueeze(-2)).sum(-1, dtype=acc) * k_scale          # k^T X: (B,T,dv)
    delta = beta * (v.to(acc) - proj) * k_scale                            # (B,T,dv)
    return X + delta.to(X.dtype).unsqueeze(-1) * k_hat.unsqueeze(-2), delta  # rank-1 write


class FusedDeltaUpdate(torch.autograd.Function):
    """delta_update with a hand-written backward, in at least fp32 whatever autocast says.

    Forward: one fused dot product per value channel (k^T X) and one multiply-add (the rank-1
    write). Backward: two more dot products and one multiply-add on the incoming gradient G; it
    keeps only X, k_hat, beta and r = v - k^T X, with no state-sized temporaries. With
    delta = beta r / sqrt(d) (also an output, with gradient g) and k = k_hat / sqrt(d):
        dL/d delta = G k_hat + g    dL/dv = beta/sqrt(d) dL/d delta        dL/dX = G - (dL/dv) k^T
        dL/dbeta = r . dL/d delta / sqrt(d)     dL/dk_hat = G^T delta - X^T dL/dv / sqrt(d)
    """

    @staticmethod
    def forward(ctx, X, k_hat, beta, v, k_scale: float):
        with torch.autocast(X.device.type, enabled=False):
            acc = _at_least_fp32(X.dtype)
            Xa, k = X.to(acc), k_hat.to(acc).unsqueeze(-2)                      # k: (B,T,1,d)
            r = v.to(acc) - torch.linalg.vecdot(Xa, k) * k_scale                 # v - k^T X: (B,T,dv)
            delta = beta.to(acc) * r * k_scale
            ctx.save_for_backward(X, k_hat, beta, r)
            ctx.k_scale, ctx.v_dtype = k_scale, v.dtype
            return torch.addcmul(Xa, delta.unsqueeze(-1), k).to(X.dtype), delta

    @staticmethod
    def backward(ctx, G, g_delta_out):
        X, k_hat, beta, r = ctx.saved_tensors
        s = ctx.k_scale
        with torch.autocast(G.device.type, enabled=False):
            acc = _at_least_fp32(X.dtype)
            Xa, k, b, G = X.to(acc), k_hat.to(acc).unsqueeze(-2), beta.to(acc), G.to(acc)
            g_delta = torch.linalg.vecdot(G, k)                                   # (B,T,dv)
            if g_delta_out is not None:
                g_delta = g_delta + g_delta_out
            g_v = g_delta * b * s
            g_beta = (g_delta * r).sum(-1, keepdim=True) * s
            g_X = torch.addcmul(G, g_v.unsqueeze(-1), k, value=-s)
            g_k = _sum_over_values((b * r * s, G), (-s * g_v, Xa))
        return g_X.to(X.dtype), g_k.to(k_hat.dtype), g_beta.to(beta.dtype), g_v.to(ctx.v_dtype), None


def _sum_over_values(*terms: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The sum over terms (w, M) of sum_j w[..., j] M[..., j, :]: (B,T,dv), (B,T,dv,d) -> (B,T,d).

    One multiply-add per value channel into one accumulator: a strided pass over each M, cheaper
    than B*T tiny (1,dv) @ (dv,d) matmuls or a state-sized product."""
    total = None
    for w, M in terms:
        for j in range(M.size(-2)):
            if total is None:
                total = torch.mul(M[..., j, :], w[..., j:j + 1])
            else:
                total.addcmul_(M[..., j, :], w[..., j:j + 1])
    return total


def _at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)  # beta_init 0 or 2: a large finite logit, the saturated limit
    return math.log(p / (1.0 - p))


class DeltaResidual(nn.Module):
    """Produces (k_hat, beta, v) for one sublayer and applies the Delta update to the state.

    Returns the new state and its rank-1 write (delta (B,T,dv), k_hat (B,T,d)):
    X_new = X + delta k_hat^T.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.mapping = cfg.mapping
        self.read_k_from_context = cfg.dv == 1  # v-Map: phi_k(x_ctx) for d_v=1, phi_k(x_in) for d_v>1
        self.k_eps, self.k_scale = cfg.k_eps, 1.0 / math.sqrt(d)
        self.v_scale = cfg.v_sigmoid_scale
        if cfg.beta_estimator == "linear":
            self.beta_gate = nn.Linear(d, 1, bias=True)
        else:
            self.beta_gate = nn.Sequential(nn.Linear(d, cfg.beta_hidden, bias=False), nn.Tanh(),
                                           nn.Linear(cfg.beta_hidden, 1, bias=True))
        self.W_v = nn.Linear(d, cfg.dv, bias=True)
        self.phi_k = nn.Linear(d, d, bias=False) if cfg.mapping == "v" else None
        self.beta_bias_init = _logit(cfg.beta_init / 2.0)
        self.update = delta_kernels(cfg.kernels)[0]
        self.last_beta: torch.Tensor | None = None  # (B,T,1), detached, for beta_stats()

    def components(self, h: torch.Tensor, x_in: torch.Tensor, c: torch.Tensor):
        """k_hat (B,T,d) with k = k_hat / sqrt(d), beta (B,T,1) fp32, v (B,T,dv)."""
        logits = self.beta_gate(c)
        beta = 2.0 * torch.sigmoid(logits.to(_at_least_fp32(logits.dtype)))
        if self.mapping == "k":
            k_raw, v_raw = h, self.W_v(x_in)
        else:
            k_raw, v_raw = self.phi_k(c if self.read_k_from_context else x_in), self.W_v(h)
        d = k_raw.size(-1)
        k_hat = F.rms_norm(k_raw, (d,), eps=self.k_eps ** 2 / d)  # = sqrt(d) k~ / sqrt(|k~|^2 + k_eps^2)
        v = self.v_scale * torch.sigmoid(v_raw)
        return k_hat, beta, v

    def forward(self, X: torch.Tensor, h: torch.Tensor, x_in: torch.Tensor, c: torch.Tensor):
        k_hat, beta, v = self.components(h, x_in, c)
        self.last_beta = beta.detach()
        X, delta = self.update(X, k_hat, beta, v, self.k_scale)
        return X, delta, k_hat


def _causal_time_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv over T. x (B,T,C), weight (C_out,1,K) with C_out a multiple of C."""
    K = weight.size(-1)
    y = F.conv1d(F.pad(x.transpose(1, 2), (K - 1, 0)), weight, groups=x.size(-1))
    return y.transpose(1, 2)                                                # (B,T,C_out)


def state_read(X: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """x_in[t] = sum over lag, j of A[j, :, L-1-lag] * X[t-lag, j, :]; X (B,T,dv,d), A (dv,d,L).

    Both compressors are this map: a causal depthwise conv over T folded with the read vector
    (L = K taps), or the per-feature mixing of the channel conv (L = 1). The plain PyTorch form:
    the reference FusedStateRead is tested against.
    """
    T, L = X.size(1), A.size(-1)
    x_in = (X * A[..., L - 1]).sum(-2)                                          # (B,T,d)
    for lag in range(1, min(L, T)):
        x_in = x_in + F.pad((X[:, : T - lag] * A[..., L - 1 - lag]).sum(-2), (0, 0, lag, 0))  # starts at t = lag
    return x_in


class FusedStateRead(torch.autograd.Function):
    """state_read with no state-sized temporary in forward (it accumulates into x_in).

    The backward shifts the (B,T,d) gradient instead of slicing the state, so every pass over
    the state is contiguous, and reuses one buffer for dL/dA.
    """

    @staticmethod
    def forward(ctx, X, A):
        T, dv, L = X.size(1), X.size(2), A.size(-1)
        x_in = torch.mul(X[:, :, 0], A[0, :, L - 1])
        for lag in range(min(L, T)):
            for j in range(dv):
                if lag or j:
                    x_in[:, lag:].addcmul_(X[:, : T - lag, j], A[j, :, L - 1 - lag])
        ctx.save_for_backward(X, A)
        return x_in

    @staticmethod
    def backward(ctx, g):
        X, A = ctx.saved_tensors
        B, T, dv, d = X.shape
        L = A.size(-1)
        g_ahead = [_ahead(g, lag).unsqueeze(2) for lag in range(min(L, T))]      # g[t + lag] at t
        g_X, product = (torch.empty(B, T, dv, d, dtype=X.dtype, device=X.device) for _ in range(2))  # contiguous
        torch.mul(g_ahead[0], A[..., L - 1], out=g_X)
        for lag in range(1, len(g_ahead)):
            g_X.addcmul_(g_ahead[lag], A[..., L - 1 - lag])
        g_A = torch.zeros_like(A)
        for lag, g_lag in enumerate(g_ahead):
            g_A[..., L - 1 - lag] = torch.mul(X, g_lag, out=product).view(B * T, dv * d).sum(0).view(dv, d)
        return g_X, g_A


def rank_one_read(delta: torch.Tensor, k_hat: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """state_read(delta k_hat^T, A) from the factors: delta (B,T,dv), k_hat (B,T,d); (B,T,d).

    The read is linear, so read(X + delta k_hat^T) = read(X) + rank_one_read(delta, k_hat, A): a
    block reads its updated state without another pass over it. The plain PyTorch form.
    """
    T, L = delta.size(1), A.size(-1)
    x = (delta @ A[..., L - 1]) * k_hat                                        # lag 0
    for lag in range(1, min(L, T)):
        x = x + F.pad((delta[:, : T - lag] @ A[..., L - 1 - lag]) * k_hat[:, : T - lag], (0, 0, lag, 0))
    return x


class FusedRankOneRead(torch.autograd.Function):
    """rank_one_read that keeps only its inputs and recomputes delta A in backward."""

    @staticmethod
    def forward(ctx, delta, k_hat, A):
        T, L = delta.size(1), A.size(-1)
        x = (delta @ A[..., L - 1]) * k_hat
        for lag in range(1, min(L, T)):
            x[:, lag:].addcmul_(delta[:, : T - lag] @ A[..., L - 1 - lag], k_hat[:, : T - lag])
        ctx.save_for_backward(delta, k_hat, A)
        return x

    @staticmethod
    def backward(ctx, g):
        delta, k_hat, A = ctx.saved_tensors
        dv, d, L = A.shape
        g_delta, g_k, g_A = torch.zeros_like(delta), torch.zeros_like(k_hat), torch.zeros_like(A)
        for lag in range(min(L, delta.size(1))):
            g_lag, A_lag = _ahead(g, lag), A[..., L - 1 - lag]                   # source token t feeds t + lag
            g_k.addcmul_(g_lag, delta @ A_lag)
            g_P = g_lag * k_hat
            g_delta += g_P @ A_lag.T
            g_A[..., L - 1 - lag] = delta.reshape(-1, dv).T @ g_P.reshape(-1, d)
        return g_delta, g_k, g_A


def _ahead(g: torch.Tensor, lag: int) -> torch.Tensor:
    """g[:, t + lag] at position t, zero past the end: (B,T,...) -> the same shape, contiguous."""
    return F.pad(g[:, lag:], (0, 0) * (g.dim() - 2) + (0, lag)) if lag else g


@functools.cache
def delta_kernels(kind: str) -> tuple:
    """(update, read, rank_one_read) for ModelConfig.kernels: the hand-fused autograd kernels, or
    the plain forms of the two state-sized ops through torch.compile. The rank-1 read stays fused
    in both: it touches only (B,T,d) tensors, and compiled it keeps delta A for backward (memory)."""
    if kind == "compiled":
        return torch.compile(delta_update), torch.compile(state_read), FusedRankOneRead.apply
    return FusedDeltaUpdate.apply, FusedStateRead.apply, FusedRankOneRead.apply


class StateCompressor(nn.Module):
    """Reads the state: x_in = state_read(X, A) with the subclass's (dv, d, L) taps A."""

    def taps(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.ops[1](X, self.taps().to(X.dtype))                     # (B,T,d)

    def read_write(self, delta: torch.Tensor, k_hat: torch.Tensor) -> torch.Tensor:
        """read(delta k_hat^T) from the (B,T,dv) and (B,T,d) factors (see rank_one_read), in delta's dtype."""
        with torch.autocast(delta.device.type, enabled=False):
            return self.ops[2](delta, k_hat.to(delta.dtype), self.taps().to(delta.dtype))


class TimeConvCompressor(StateCompressor):
    """conv none/ec: x_in = sum_j w_p[j] * ShortConv_T(X)[..., j] (appendix B.3).

    The depthwise causal conv over T and the read vector are folded into one (d_v, d, K) kernel:
    the convolved state is never materialised.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        K, channels = cfg.state_kernel, cfg.d_model * cfg.dv
        self.dv = cfg.dv
        self.weight = nn.Parameter(torch.empty(channels, 1, K).uniform_(-K ** -0.5, K ** -0.5))  # channel i*dv + j
        self.read = nn.Parameter(torch.full((cfg.dv,), cfg.read_value))   # w_p
        self.ops = delta_kernels(cfg.kernels)

    def taps(self) -> torch.Tensor:
        d, K = self.weight.size(0) // self.dv, self.weight.size(-1)
        return (self.weight.view(d, self.dv, K) * self.read[:, None]).transpose(0, 1)  # (dv, d, K); tap K-1 is lag 0


class ChannelConvCompressor(StateCompressor):
    """conv cc/cc_ec: per-feature causal conv along the d_v axis, then the read vector w_p.

    Both maps are linear along d_v, so together they are one per-feature weighted sum
    x_in[i] = sum_j a[i, j] X[i, j] with a[i, j] = sum_s c[i, K-1-s] w_p[j + s] (lag s; the last
    tap is lag 0, as in the causal conv over T): computed from the (d, K) kernel and w_p, never
    materialising the convolved state.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        K = cfg.state_kernel
        self.weight = nn.Parameter(torch.empty(cfg.d_model, K).uniform_(-K ** -0.5, K ** -0.5))   # c
        self.read = nn.Parameter(torch.full((cfg.dv,), cfg.read_value))                           # w_p
        self.ops = delta_kernels(cfg.kernels)

    def mixing(self) -> torch.Tensor:
        dv = self.read.numel()
        a = self.weight.new_zeros(self.weight.size(0), dv)
        K = self.weight.size(1)
        for s in range(K):                             # lag s: channel j feeds the output at j + s
            a[:, : dv - s] += self.weight[:, K - 1 - s:K - s] * self.read[s:]
        return a                                                               # (d, dv)

    def taps(self) -> torch.Tensor:
        return self.mixing().T.unsqueeze(-1)                                    # one tap over T: (dv, d, 1)


def make_compressor(cfg: ModelConfig) -> StateCompressor:
    return ChannelConvCompressor(cfg) if cfg.channel_conv else TimeConvCompressor(cfg)


class EmbedExpander(nn.Module):
    """conv ec/cc_ec: causal depthwise conv over T mapping (B,T,d) -> (B,T,dv,d), identity at init."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dv, K = cfg.dv, cfg.embed_conv_kernel
        weight = torch.zeros(cfg.d_model * cfg.dv, 1, K)
        weight[:, 0, -1] = 1.0  # the current token's tap: X0[:, t, j, i] = x_emb[:, t, i]
        self.weight = nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        X = _causal_time_conv(x, self.weight.to(x.dtype)).view(B, T, d, self.dv)  # channel i*dv + j
        return X.transpose(-1, -2).contiguous()

    def read_expanded(self, x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
        """state_read(self(x), taps) as one causal depthwise conv of x (B,T,d), taps (dv,d,L).

        Both maps are convs over T, so they compose: read tap p and expander tap m land on tap
        p + m of a (d, L+K-1) kernel, summed over d_v. The expanded state is not read.
        """
        d, K, L = x.size(-1), self.weight.size(-1), taps.size(-1)
        with torch.autocast(x.device.type, enabled=False):
            w = self.weight.view(d, self.dv, K).transpose(0, 1).to(taps.dtype)      # (dv, d, K)
            composite = taps.new_zeros(d, L + K - 1)
            for p in range(L):
                composite[:, p:p + K] += (taps[..., p, None] * w).sum(0)
            return _causal_time_conv(x.to(taps.dtype), composite.unsqueeze(1))
