"""The Deep Delta residual (paper sections 2-4, appendix B).

The paper's state X is a d x d_v matrix per token; it is stored transposed, as (B, T, d_v, d), so
that the d features are contiguous and every read and write of the state is a batched mat-vec or
a contiguous multiply-add. d_v = 1 is the vector case of Eq. 3.1 (an axis of 1).
One Delta sublayer, given the sublayer output h = F(RMSNorm(x_in)):

    k    = k~ / ||k~||          k-Map: k~ = h            v-Map: k~ = phi_k(.)
    beta = 2 sigmoid(Linear(c))  c = RMSNorm(x_in), logits in fp32
    v    = s sigmoid(W_v u)      k-Map: u = x_in         v-Map: u = h
    X   <- X + beta k (v^T - k^T X)                      (Eq. 2.5)

The update normalises k~ itself and returns its rank-1 write as factors, X + w k~^T.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .fused import (FusedExpand, FusedRankOneRead, FusedStateRead, at_least_fp32, autocast_off, eager, fused_key,
                    fused_write, norm_projections, update_steps)
from .mup import value_multiplier


def delta_update(X: torch.Tensor, k_raw: torch.Tensor, beta: torch.Tensor, v: torch.Tensor,
                 k_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2.5, X + beta k (v^T - k^T X), with the unit key k = k~ / sqrt(|k~|^2 + k_eps^2).

    The rank-1 write beta k (v^T - k^T X) is returned as its factors: the new state X + w k~^T and
    w = beta (v - k^T X) / sqrt(|k~|^2 + k_eps^2) (B,T,dv, at least fp32), which let a compressor
    read the new state cheaply (read_write). The normalisation runs in at least fp32, so a bf16 k~
    loses no precision to it (paper 4.1).

    The plain PyTorch form: the reference that fused_update (what the model runs) is tested
    against. X (B,T,dv,d), k~ (B,T,d), beta (B,T,1) fp32, v (B,T,dv).
    """
    acc = at_least_fp32(X.dtype)
    k_raw = k_raw.to(acc)
    rho = torch.rsqrt((k_raw * k_raw).sum(-1, keepdim=True) + k_eps ** 2)   # k = rho k~: (B,T,1)
    proj = (X * k_raw.unsqueeze(-2)).sum(-1, dtype=acc) * rho              # k^T X: (B,T,dv)
    w = beta * (v.to(acc) - proj) * rho                                    # (B,T,dv)
    return X + w.to(X.dtype).unsqueeze(-1) * k_raw.to(X.dtype).unsqueeze(-2), w


def delta_update_steps(X: torch.Tensor, steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], k_eps: float,
                       update: Callable = delta_update) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A sublayer's Delta updates [(k~_s, beta_s, v_s)] in turn, X_s = update(X_{s-1}, k~_s, beta_s, v_s):
    (X_S, [w_s]), so X_S = X + sum_s w_s k~_s^T. The plain form (with delta_update), the reference
    fused.update_steps is tested against."""
    writes = []
    for k_raw, beta, v in steps:
        X, w = update(X, k_raw, beta, v, k_eps)
        writes.append(w)
    return X, writes


def delta_key(X: torch.Tensor, k_raw: torch.Tensor, beta: torch.Tensor, v: torch.Tensor, x_in: torch.Tensor,
              A: torch.Tensor, k_eps: float, rank_one: Callable | None = None) -> tuple[torch.Tensor, ...]:
    """A d_v > 1 block's first update and its read of the mid state in DeltaKey's signature, (w, the mid state or its
    handle, x_in + rank_one_read(w, k~, A)) with x_in the read of X: the plain form returns the mid state itself."""
    X_mid, w = delta_update(X, k_raw, beta, v, k_eps)
    return w, X_mid, x_in + (rank_one_read if rank_one is None else rank_one)(w, k_raw, A)


def delta_write(X_mid: torch.Tensor, X: torch.Tensor, k_a: torch.Tensor, w_a: torch.Tensor, k_raw: torch.Tensor,
                beta: torch.Tensor, v: torch.Tensor, A: torch.Tensor, k_eps: float, store_state: bool,
                update: Callable = delta_update, read: Callable | None = None) -> tuple[torch.Tensor, ...]:
    """A d_v > 1 block's second update and the next read in DeltaWrite's signature, (X_out, w, state_read(X_out, A)):
    the plain form updates the mid state it is given (X, k~_a and w_a, from which DeltaWrite rebuilds it, unused)."""
    X_out, w = update(X_mid, k_raw, beta, v, k_eps)
    # `is None`, not `or`: dynamo on CUDA (torch 2.11) cannot take the truth of a torch.compile'd read
    return X_out, w, (state_read if read is None else read)(X_out, A)


BETA_MAX = 2.0   # beta = 2 sigmoid(.), in (0, 2): past 1 the update reflects


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)  # beta_init 0 or 2: a large finite logit, the saturated limit
    return math.log(p / (1.0 - p))


class SublayerInput(NamedTuple):
    """What a Delta sublayer reads: x_in (B,T,d), the compressed state; c = RMSNorm(x_in), what F
    reads; and the gates that read them, folded into the norm (norm_projections), every step's side by
    side (n_h of them): gate, of c: beta itself (B,T,n_h) for the linear estimator, the hidden layer's
    input (B,T,n_h hidden) for the MLP; v of x_in (B,T,n_h dv), k-Map only."""
    x_in: torch.Tensor
    c: torch.Tensor
    gate: torch.Tensor
    v: torch.Tensor | None


def make_beta_gate(cfg: ModelConfig) -> nn.Module:
    """The beta estimator of appendix B: a Linear d->1, or d->hidden->tanh->1."""
    if cfg.beta_estimator == "linear":
        return nn.Linear(cfg.d_model, 1, bias=True)
    return nn.Sequential(nn.Linear(cfg.d_model, cfg.beta_hidden, bias=False), nn.Tanh(),
                         nn.Linear(cfg.beta_hidden, 1, bias=True))


def gate_input(beta_gate: nn.Module) -> nn.Linear:
    """The gate's first Linear, the one that reads c (folded into the sublayer's norm_projections)."""
    return beta_gate if isinstance(beta_gate, nn.Linear) else beta_gate[0]


def gate_beta(beta_gate: nn.Module, gate: torch.Tensor) -> torch.Tensor:
    """beta from the norm's gate output: beta itself for the linear estimator (the norm applied 2 sigmoid(. + b));
    for the MLP, 2 sigmoid of tanh, then the output layer, of its hidden layer's input, in at least fp32."""
    if isinstance(beta_gate, nn.Linear):
        return gate
    logits = beta_gate[1:](gate)
    return BETA_MAX * torch.sigmoid(logits.to(at_least_fp32(logits.dtype)))


def gate_output(beta_gate: nn.Module) -> nn.Linear:
    """The gate's last Linear, whose bias sets beta at init."""
    return beta_gate if isinstance(beta_gate, nn.Linear) else beta_gate[-1]


class FurtherDeltaStep(nn.Module):
    """Step j >= 2 of a DeltaProduct sublayer (ModelConfig.n_h): k~_j = W_k^j h, beta_j of c,
    v_j = s sigmoid(W_v^j u) with u = x_in (k-Map) or h (v-Map). The gates that read c and x_in run in
    the sublayer's norm_projections (DeltaResidual.read_input)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_k = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.beta_gate = make_beta_gate(cfg)
        self.W_v = nn.Linear(cfg.d_model, cfg.dv, bias=True)
        self.value_of_h = cfg.mapping == "v"

    def components(self, h: torch.Tensor, gate: torch.Tensor, v: torch.Tensor | None, v_scale: float):
        """k~_j, beta_j, v_j from h and this step's share of the norm's gates (v None: v-Map)."""
        if self.value_of_h:
            v = v_scale * torch.sigmoid(self.W_v(h))
        return self.W_k(h), gate_beta(self.beta_gate, gate), v


def _side_by_side(maps: tuple[nn.Linear, ...], part: str) -> torch.Tensor:
    """The steps' maps of one input as one: their `part` ('weight' (out, d) or 'bias') stacked by output, (n out, ...);
    one step's as it is."""
    return getattr(maps[0], part) if len(maps) == 1 else torch.cat([getattr(m, part) for m in maps])


class DeltaResidual(nn.Module):
    """Produces (k~, beta, v) for one sublayer and applies the Delta update to the state, n_h times
    in sequence (steps j >= 2: FurtherDeltaStep): read_input, then update.

    update returns the new state and the factors of each step's rank-1 write [(w_j (B,T,dv), k~_j (B,T,d))]:
    X_new = X + sum_j w_j k~_j^T (see delta_update).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.read_k_from_context = cfg.dv == 1  # v-Map: phi_k(x_ctx) for d_v=1, phi_k(x_in) for d_v>1
        self.k_eps = cfg.k_eps
        self.v_scale = cfg.v_sigmoid_scale * value_multiplier(cfg)   # µP: times sqrt(m); CompleteP: the write's r
        self.beta_gate = make_beta_gate(cfg)
        self.W_v = nn.Linear(d, cfg.dv, bias=True)
        self.phi_k = nn.Linear(d, d, bias=False) if cfg.mapping == "v" else None
        self.further = nn.ModuleList(FurtherDeltaStep(cfg) for _ in range(cfg.n_h - 1))
        # What a call reads, decided once: the steps' maps (step 1's first) as plain tuples of the registered modules,
        # their count and the mapping as plain values. A sublayer's Python is a dispatch-bound step's time, and a
        # module attribute or a ModuleList's iteration costs a lookup chain where a tuple costs an index.
        gates = (self.beta_gate, *(step.beta_gate for step in self.further))
        self.maps_of_c = tuple(gate_input(gate) for gate in gates)           # each gate's first Linear
        self.values = (self.W_v, *(step.W_v for step in self.further))
        self.n_h = cfg.n_h
        self.value_of_x = cfg.mapping == "k"                # k-Map: v of x_in (in the norm's op); v-Map: of h
        self.linear_gate = isinstance(self.beta_gate, nn.Linear)
        self.beta_bias_init = _logit(cfg.beta_init / BETA_MAX)
        ops = delta_kernels(cfg.kernels)
        self.update_steps, self.norm_projections = ops.update_steps, ops.norm
        self.last_betas: list[torch.Tensor] = []  # per step, (B,T,1), detached, for beta_stats()
        self.recording = False                    # keep every step's (k~, beta, v) too: the coordinate check's
        self.last_steps: list[tuple[torch.Tensor, ...]] = []

    def gate_outputs(self) -> list[nn.Linear]:
        return [gate_output(self.beta_gate)] + [gate_output(step.beta_gate) for step in self.further]

    def read_input(self, x_in: torch.Tensor, norm: nn.RMSNorm) -> SublayerInput:
        """c = norm(x_in) and every step's gates of c and x_in, in one op: the linear estimator's beta and the k-Map's
        v activated there, the MLP estimator's first map without its bias."""
        W_c = _side_by_side(self.maps_of_c, "weight")
        b_c = _side_by_side(self.maps_of_c, "bias") if self.linear_gate else None
        if self.value_of_x:
            W_x, b_x = _side_by_side(self.values, "weight"), _side_by_side(self.values, "bias")
        else:
            W_x, b_x = x_in.new_zeros(0, x_in.size(-1)), None
        c, gate, v = self.norm_projections(x_in, norm.weight, W_c, W_x, norm.eps, b_c, b_x, BETA_MAX, self.v_scale)
        return SublayerInput(x_in, c, gate, v if self.value_of_x else None)

    def components(self, h: torch.Tensor, inp: SublayerInput, gate: torch.Tensor, v: torch.Tensor | None):
        """Step 1's k~ (B,T,d), the key before its normalisation (the update's), beta (B,T,1) fp32, v (B,T,dv)."""
        beta = gate if self.linear_gate else gate_beta(self.beta_gate, gate)
        if self.value_of_x:
            return h, beta, v
        k_raw = self.phi_k(inp.c if self.read_k_from_context else inp.x_in)
        return k_raw, beta, self.v_scale * torch.sigmoid(self.W_v(h))

    def steps(self, h: torch.Tensor, inp: SublayerInput) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Every step's (k~, beta, v) from the sublayer output h and its input (recording the betas)."""
        if self.n_h == 1:
            steps = [self.components(h, inp, inp.gate, inp.v)]
        else:
            gates = inp.gate.chunk(self.n_h, -1)          # each step's share of the norm's gates
            values = [None] * len(gates) if inp.v is None else inp.v.chunk(len(gates), -1)
            steps = [self.components(h, inp, gates[0], values[0])]
            steps += [step.components(h, gate, v, self.v_scale)
                      for step, gate, v in zip(self.further, gates[1:], values[1:], strict=True)]
        self.last_betas = [beta.detach() for _, beta, _ in steps]
        if self.recording:
            self.last_steps = [tuple(t.detach() for t in step) for step in steps]
        return steps

    def update(self, X: torch.Tensor, h: torch.Tensor, inp: SublayerInput):
        """(X_new, [(w_j, k~_j)]): a method, not the module's forward, whose call would pass through nn.Module's
        hook machinery twice a block."""
        steps = self.steps(h, inp)
        X, ws = self.update_steps(X, steps, self.k_eps)   # X <- (I - beta_j k_j k_j^T) X + beta_j k_j v_j^T, j = 1..n_h
        return X, [(w, k_raw) for w, (k_raw, _, _) in zip(ws, steps, strict=True)]


def expand_state(x: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    """X0[t, j] = sum over lag of E[j, :, L-1-lag] * x[t-lag]: x (B,T,d), E (dv,d,L) -> (B,T,dv,d).

    The EC expander, a causal depthwise conv over T with d_v output channels per feature. The plain
    PyTorch form: the reference FusedExpand is tested against.
    """
    T, L = x.size(1), E.size(-1)
    X = x.unsqueeze(-2) * E[..., L - 1]
    for lag in range(1, min(L, T)):
        X = X + F.pad(x[:, : T - lag].unsqueeze(-2) * E[..., L - 1 - lag], (0, 0, 0, 0, lag, 0))
    return X


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


def rank_one_read(w: torch.Tensor, k_raw: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """state_read(w k~^T, A) from the factors: w (B,T,dv), k~ (B,T,d); (B,T,d).

    The read is linear, so read(X + w k~^T) = read(X) + rank_one_read(w, k~, A): a
    block reads its updated state without another pass over it. The plain PyTorch form.
    """
    T, L = w.size(1), A.size(-1)
    x = (w @ A[..., L - 1]) * k_raw                                            # lag 0
    for lag in range(1, min(L, T)):
        x = x + F.pad((w[:, : T - lag] @ A[..., L - 1 - lag]) * k_raw[:, : T - lag], (0, 0, lag, 0))
    return x


class DeltaOps(NamedTuple):
    """The state's ops, one implementation kind (ModelConfig.kernels)."""
    update_steps: Callable    # delta_update_steps's signature: a sublayer's n_h updates
    read: Callable            # state_read's
    rank_one_read: Callable   # rank_one_read's
    expand: Callable          # expand_state's
    key: Callable             # delta_key's: a d_v > 1 block's first update and its next read, n_h = 1
    write: Callable           # delta_write's: its second update and the next read
    norm: Callable            # norm_projections's: a sublayer's RMSNorm and its gates' first maps


@functools.cache
def delta_kernels(kind: str) -> DeltaOps:
    """The state's ops for ModelConfig.kernels: the hand-fused autograd kernels, or the plain forms of
    the per-sublayer ops (the norm and gate maps too) through torch.compile. The rank-1 read and the EC
    expansion stay fused in both: the first touches only (B,T,d) tensors (and compiled it keeps w A for
    backward), the second runs once per forward."""
    if kind == "compiled":
        update, read = torch.compile(delta_update), torch.compile(state_read)
        return DeltaOps(functools.partial(delta_update_steps, update=update), read, FusedRankOneRead.apply,
                        FusedExpand.apply, torch.compile(functools.partial(delta_key, rank_one=FusedRankOneRead.apply)),
                        functools.partial(delta_write, update=update, read=read),
                        torch.compile(eager.norm_projections))
    return DeltaOps(update_steps, FusedStateRead.apply, FusedRankOneRead.apply, FusedExpand.apply, fused_key,
                    fused_write, norm_projections)


class StateCompressor(nn.Module):
    """Reads the state: x_in = state_read(X, A) with the subclass's (dv, d, L) taps A (taps(); a caller that has
    them passes them)."""

    def taps(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, X: torch.Tensor, taps: torch.Tensor | None = None) -> torch.Tensor:
        return self.ops.read(X, self.taps() if taps is None else taps)       # (B,T,d), in at least fp32

    def read_write(self, w: torch.Tensor, k_raw: torch.Tensor, taps: torch.Tensor | None = None) -> torch.Tensor:
        """read(w k~^T) from the (B,T,dv) and (B,T,d) factors (see rank_one_read), in w's dtype."""
        return self.ops.rank_one_read(w, k_raw, self.taps() if taps is None else taps)


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
    """conv cc/cc_ec: per-feature conv along the d_v axis, then the read vector w_p.

    The conv pads (K-1) zeros, `pad` = (K-1)//2 of them on the left (cc_padding=centered) or all
    K-1 (causal), and returns d_v outputs: out[o] = sum_s c[s] X[o + s - pad]. Both maps are linear
    along d_v, so together they are one per-feature weighted sum x_in[i] = sum_j a[i, j] X[i, j] with
    a[i, j] = sum_s c[i, s] w_p[j + pad - s]: computed from the (d, K) kernel and w_p, never
    materialising the convolved state.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        K = cfg.state_kernel
        self.weight = nn.Parameter(torch.empty(cfg.d_model, K).uniform_(-K ** -0.5, K ** -0.5))   # c
        self.read = nn.Parameter(torch.full((cfg.dv,), cfg.read_value))                           # w_p
        self.pad = K - 1 if cfg.cc_padding == "causal" else (K - 1) // 2
        self.ops = delta_kernels(cfg.kernels)

    def mixing(self) -> torch.Tensor:
        dv, K = self.read.numel(), self.weight.size(1)
        a = self.weight.new_zeros(self.weight.size(0), dv)
        for s in range(K):                    # tap s: channel j feeds the output o = j + shift
            shift = self.pad - s
            if shift >= 0:
                a[:, : dv - shift] += self.weight[:, s:s + 1] * self.read[shift:]
            else:
                a[:, -shift:] += self.weight[:, s:s + 1] * self.read[: dv + shift]
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
        self.ops = delta_kernels(cfg.kernels)

    def taps(self) -> torch.Tensor:
        d, K = self.weight.size(0) // self.dv, self.weight.size(-1)
        return self.weight.view(d, self.dv, K).transpose(0, 1)                # (dv, d, K); channel i*dv + j

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.expand(x, self.taps().to(x.dtype))                        # (B,T,dv,d)

    def read_expanded(self, x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
        """state_read(self(x), taps) from x (B,T,d), taps (dv,d,L), without the expanded state.

        Both maps are convs over T, so they compose: read tap p and expander tap m land on tap
        p + m of one (d, L+K-1) kernel, summed over d_v, which reads x as the rank-1 state x 1^T.
        """
        B, T, d = x.shape
        K, L = self.weight.size(-1), taps.size(-1)
        with autocast_off(x.device.type):
            E = self.taps().to(taps.dtype)
            composite = taps.new_zeros(1, d, L + K - 1)
            for p in range(L):
                composite[0, :, p:p + K] += (taps[..., p, None] * E).sum(0)
            return self.ops.rank_one_read(x.new_ones(B, T, 1, dtype=taps.dtype), x.to(taps.dtype), composite)
