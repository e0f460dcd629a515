"""The fused ops' loops as Triton kernels, for CUDA: what cpu.cpp does on CPU, as torch.ops.ddl_triton.

The same ops, signatures and shapes as cpu.cpp (its header has the symbols): X (B,T,dv,d) the state,
h = k~ (B,T,d) the raw key, beta and rho (B,T,1), v, w, q (B,T,dv), A and E (dv,d,L) taps, tap L-1
weighing the current token (lag 0). Inputs may be fp32 or bf16, each its own: every kernel loads them
as fp32, computes in fp32 and rounds each output once: the state and its gradient in the state's dtype;
w, rho, q, the reads and the taps' and weights' gradients in at least fp32; other gradients in their
input's dtype. A state is read in place when its tokens are evenly strided (the repeated embedding X0:
channel stride 0).

Layouts:
- per token (the updates, DeltaKey, DeltaWrite, the norm): |k~|^2, X_j . k~ and the norm's mean are
  sums over d, so one program takes a token's channels one row of d after another (DeltaProduct's
  steps: its whole (dv, d) tile). DeltaWrite rebuilds the L-1 tokens before its own for the next read.
- tiles of TOKENS_PER_TILE tokens by a block of features (the rank-1 read, DeltaWrite's taps'
  gradient): elementwise along d; a program writes its tile's own partial of the taps' gradient.
- chunks (the read's and the expansion's backwards, the norm's): one program walks TOKENS_PER_CHUNK
  tokens in order into a partial of its own.
Partials are summed by torch in order: no atomics, the same bits on every run of a shape.

The read and the expansion are torch.library.triton_ops (torch.compile traces into them); every other
op is a custom op with a fake, which compile calls as it is. Importing this module imports triton;
ddl.model.fused does so on the CUDA path only. Under TRITON_INTERPRET=1 (set before this import) the
kernels run on CPU tensors, as the tests do.
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import custom_op, triton_op, wrap_triton

TOKENS_PER_CHUNK = 64       # tokens a backward program sums the taps' gradient over, in order
# Warps of a program: a row kernel's (rows of up to 1024 features), a norm's, a tile's. Fixed: on the H100
# (2026-11-26) triton.autotune over 1-16 warps picked slower kernels than these for the norm, the rank-1 read and
# d_v=1's update (noisy timings of short kernels), took a d_v=4 model's first step from 16 to 27 s, and let two
# processes of one run pick different kernels (different rounding: a resumed run's curve drifts).
ROW_WARPS, NORM_WARPS, TILE_WARPS = 4, 4, 4

FEATURES_PER_BLOCK = 64     # features (along d) per program of the depthwise ops


# ---- the update: one program per token n, its (dv, d) tile in registers ----

@triton.jit
def _step_inputs(h, beta, v, row, j, i, in_dv, in_d, dv, d):
    """k~, beta and v of one update as fp32: row n (one update a token) or n * S + s (step s of S)."""
    k = tl.load(h + row * d + i, mask=in_d, other=0.0).to(tl.float32)
    b = tl.load(beta + row).to(tl.float32)
    v_n = tl.load(v + row * dv + j, mask=in_dv, other=0.0).to(tl.float32)
    return k, b, v_n


# No helper that takes a tensor argument returns what a store's address is computed from: torch.compile
# finds the tensors a kernel writes by following each store's address back through its TTIR, over every
# argument of a helper call it meets, and a tensor it takes for written is an input mutated in place (an
# input of a traced autograd Function: wrong gradients; a parameter: refused).

@triton.jit
def _update_axes(dv, d, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's token n, its channel and feature indices and masks, and the offsets of its (dv, d) tile."""
    n = tl.program_id(0).to(tl.int64)
    j, i = tl.arange(0, BLOCK_DV), tl.arange(0, BLOCK_D)
    in_dv, in_d = j < dv, i < d
    tile = (n * dv + j[:, None]) * d + i[None, :]
    in_tile = in_dv[:, None] & in_d[None, :]
    return n, j, i, in_dv, in_d, tile, in_tile


@triton.jit
def _step_saved(rho, q, g_w, row, j, in_dv, dv, HAS_G_W: tl.constexpr):
    """What one update's forward saved (rho, q) and dL/dw (zero without g_w), as fp32."""
    r = tl.load(rho + row).to(tl.float32)
    q_n = tl.load(q + row * dv + j, mask=in_dv, other=0.0).to(tl.float32)
    g_w_n = tl.zeros_like(q_n)
    if HAS_G_W:
        g_w_n += tl.load(g_w + row * dv + j, mask=in_dv, other=0.0).to(tl.float32)
    return r, q_n, g_w_n


@triton.jit
def _store_step_grads(g_h, g_beta, g_v, g_k, g_b, g_res, row, j, i, in_dv, in_d, dv, d):
    tl.store(g_h + row * d + i, g_k.to(g_h.dtype.element_ty), mask=in_d)
    tl.store(g_beta + row, g_b.to(g_beta.dtype.element_ty))
    tl.store(g_v + row * dv + j, g_res.to(g_v.dtype.element_ty), mask=in_dv)


@triton.jit
def _step_forward(X_n, k, b, v_n, eps2):
    """One update of a (dv, d) tile: X + w k~^T, w, rho, q."""
    # rho = 1 / sqrt(|k~|^2 + eps^2), as fp32: inductor passes the float eps2 as fp64, which would make the
    # tile fp64 (and DeltaProduct's loop-carried state change type: a compile error)
    r = (1.0 / tl.sqrt(tl.sum(k * k) + eps2)).to(tl.float32)
    q_n = tl.sum(X_n * k[None, :], axis=1)                        # X_j . k~
    w_n = b * r * (v_n - r * q_n)
    return X_n + w_n[:, None] * k[None, :], w_n, r, q_n


@triton.jit
def _step_backward(G_n, g_w_n, X_n, k, b, v_n, r, q_n):
    """One update's backward, given G = dL/dX_new and dL/dw: dL/dX, dL/dk~, dL/dbeta, dL/dv."""
    g_w_n += tl.sum(G_n * k[None, :], axis=1)                     # dL/dw_j = G_j . k~ + g_w_j
    res = v_n - r * q_n                                           # v_j - k^T X_j
    g_res = g_w_n * b * r                                         # = dL/dv_j
    g_q = -g_res * r
    g_b = tl.sum(g_w_n * r * res)
    g_r = tl.sum(g_w_n * b * res - g_res * q_n)
    w_n = b * r * res
    # through rho: -rho^3 k~; then sum_j w_j G_j + g_q_j X_j
    g_k = -g_r * r * r * r * k + tl.sum(w_n[:, None] * G_n + g_q[:, None] * X_n, axis=0)
    return G_n + g_q[:, None] * k[None, :], g_k, g_b, g_res


@triton.jit
def _store_step(w, rho, q, w_n, r, q_n, row, j, in_dv, dv):
    tl.store(w + row * dv + j, w_n.to(w.dtype.element_ty), mask=in_dv)
    tl.store(q + row * dv + j, q_n.to(q.dtype.element_ty), mask=in_dv)
    tl.store(rho + row, r.to(rho.dtype.element_ty))


# ---- the update, DeltaKey and DeltaWrite: one program per token, its DV channels' rows of d one after another (each
# a 1-D vector, so every sum is over d or over the unrolled channels: no transpose of a (dv, d) tile) ----

@triton.jit
def _token_row(d, BLOCK_D: tl.constexpr):
    """This program's token and the features of a row, with their mask."""
    n = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_D)
    return n, i, i < d


@triton.jit
def _row(X, n, sXn, sXj, j, i, in_d):
    """Token n's channel j row of a state with strides sXn (tokens) and sXj (channels; 0: repeated), fp32."""
    return tl.load(X + n * sXn + j * sXj + i, mask=in_d, other=0.0).to(tl.float32)


@triton.jit
def _vec(x, n, i, in_d, d):
    """Row n of a (N, d) tensor, fp32."""
    return tl.load(x + n * d + i, mask=in_d, other=0.0).to(tl.float32)


@triton.jit
def _key_norm(k, eps2):
    """rho = 1 / sqrt(|k~|^2 + eps^2), fp32 (inductor passes the float eps2 as fp64)."""
    return (1.0 / tl.sqrt(tl.sum(k * k) + eps2)).to(tl.float32)


@triton.jit
def _update_forward_kernel(X, h, beta, v, X_new, w, rho, q, eps2, sXn, sXj, d, STORE_STATE: tl.constexpr,
                           DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """One update per token: X_new (when STORE_STATE; else only w, rho, q: DeltaKey's), w, rho, q."""
    n, i, in_d = _token_row(d, BLOCK_D)
    k = _vec(h, n, i, in_d, d)
    b, r = tl.load(beta + n).to(tl.float32), _key_norm(k, eps2)
    tl.store(rho + n, r.to(rho.dtype.element_ty))
    for j in tl.static_range(DV):
        X_j = _row(X, n, sXn, sXj, j, i, in_d)
        q_j = tl.sum(X_j * k)
        w_j = b * r * (tl.load(v + n * DV + j).to(tl.float32) - r * q_j)
        tl.store(q + n * DV + j, q_j.to(q.dtype.element_ty))
        tl.store(w + n * DV + j, w_j.to(w.dtype.element_ty))
        if STORE_STATE:
            tl.store(X_new + (n * DV + j) * d + i, (X_j + w_j * k).to(X_new.dtype.element_ty), mask=in_d)


@triton.jit
def _channel_backward(G_j, X_j, k, b, r, v_j, q_j, g_w_j):
    """One channel's share of the update's backward: dL/dw_j = G_j . k~ + g_w_j, then (dL/dX_j, dL/dv_j, its terms of
    dL/dbeta and dL/drho, and of dL/dk~ beside -rho^3 k~ dL/drho: w_j G_j + g_q_j X_j)."""
    g_w_j += tl.sum(G_j * k)
    res = v_j - r * q_j                                            # v_j - k^T X_j
    g_res = g_w_j * b * r                                          # = dL/dv_j
    g_q = -g_res * r
    return (G_j + g_q * k, g_res, g_w_j * r * res, g_w_j * b * res - g_res * q_j, (b * r * res) * G_j + g_q * X_j)


@triton.jit
def _update_backward_kernel(G, g_w, X, h, beta, v, rho, q, g_X, g_h, g_beta, g_v, sXn, sXj, d,
                            HAS_G_W: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr):
    n, i, in_d = _token_row(d, BLOCK_D)
    k = _vec(h, n, i, in_d, d)
    b, r = tl.load(beta + n).to(tl.float32), tl.load(rho + n).to(tl.float32)
    g_k = tl.zeros((BLOCK_D,), dtype=tl.float32)
    g_b, g_r = 0.0, 0.0
    for j in tl.static_range(DV):
        g_w_j = tl.load(g_w + n * DV + j).to(tl.float32) if HAS_G_W else 0.0
        g_X_j, g_v_j, g_b_j, g_r_j, g_k_j = _channel_backward(
            _vec(G, n * DV + j, i, in_d, d), _row(X, n, sXn, sXj, j, i, in_d), k, b, r,
            tl.load(v + n * DV + j).to(tl.float32), tl.load(q + n * DV + j).to(tl.float32), g_w_j)
        tl.store(g_X + (n * DV + j) * d + i, g_X_j.to(g_X.dtype.element_ty), mask=in_d)
        tl.store(g_v + n * DV + j, g_v_j.to(g_v.dtype.element_ty))
        g_b, g_r, g_k = g_b + g_b_j, g_r + g_r_j, g_k + g_k_j
    tl.store(g_h + n * d + i, (g_k - g_r * r * r * r * k).to(g_h.dtype.element_ty), mask=in_d)   # through rho
    tl.store(g_beta + n, g_b.to(g_beta.dtype.element_ty))


# ---- a d_v > 1 block's second update (DeltaWrite): the mid state X + w_a k~_a^T rebuilt per token, updated, and
# read by the next block's taps over the last L tokens (each rebuilt where the read needs it). A_lag: the taps by lag,
# (L, DV, d) contiguous ----

@triton.jit
def _write_forward_kernel(X, h_a, w_a, h, beta, v, A_lag, X_new, w, rho, q, x_next, eps2, sXn, sXj, T, d,
                          STORE_STATE: tl.constexpr, L: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr):
    n, i, in_d = _token_row(d, BLOCK_D)
    read = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for lag in tl.static_range(L):
        if lag <= n % T:                                           # t - lag within the sequence
            s = n - lag
            k_a, k = _vec(h_a, s, i, in_d, d), _vec(h, s, i, in_d, d)
            b, r = tl.load(beta + s).to(tl.float32), _key_norm(k, eps2)
            for j in tl.static_range(DV):
                X_j = _row(X, s, sXn, sXj, j, i, in_d) + tl.load(w_a + s * DV + j).to(tl.float32) * k_a
                q_j = tl.sum(X_j * k)
                w_j = b * r * (tl.load(v + s * DV + j).to(tl.float32) - r * q_j)
                out_j = X_j + w_j * k
                read += _vec(A_lag, lag * DV + j, i, in_d, d) * out_j
                if lag == 0:
                    tl.store(q + n * DV + j, q_j.to(q.dtype.element_ty))
                    tl.store(w + n * DV + j, w_j.to(w.dtype.element_ty))
                    if STORE_STATE:
                        tl.store(X_new + (n * DV + j) * d + i, out_j.to(X_new.dtype.element_ty), mask=in_d)
            if lag == 0:
                tl.store(rho + n, r.to(rho.dtype.element_ty))
    tl.store(x_next + n * d + i, read.to(x_next.dtype.element_ty), mask=in_d)


@triton.jit
def _write_backward_kernel(G, g_w, g_next, X, h_a, w_a, h, beta, v, rho, q, A_lag, G_mid, g_h, g_beta, g_v, sXn, sXj,
                           T, d, HAS_G: tl.constexpr, HAS_G_W: tl.constexpr, L: tl.constexpr, DV: tl.constexpr,
                           BLOCK_D: tl.constexpr):
    """dL/dX_out (G, or zero) plus the read's sum over lag of A_lag * g_next[t+lag], then the update's backward at the
    rebuilt mid state: dL/dX_mid, dL/dk~, dL/dbeta, dL/dv. (The taps' gradient: _write_taps_kernel.)"""
    n, i, in_d = _token_row(d, BLOCK_D)
    k_a, k = _vec(h_a, n, i, in_d, d), _vec(h, n, i, in_d, d)
    b, r = tl.load(beta + n).to(tl.float32), tl.load(rho + n).to(tl.float32)
    g_k = tl.zeros((BLOCK_D,), dtype=tl.float32)
    g_b, g_r = 0.0, 0.0
    for j in tl.static_range(DV):
        G_j = _vec(G, n * DV + j, i, in_d, d) if HAS_G else tl.zeros((BLOCK_D,), dtype=tl.float32)
        for lag in tl.static_range(L):
            if n % T + lag < T:                                    # X_out[t] feeds the read at t + lag
                G_j += _vec(A_lag, lag * DV + j, i, in_d, d) * _vec(g_next, n + lag, i, in_d, d)
        X_j = _row(X, n, sXn, sXj, j, i, in_d) + tl.load(w_a + n * DV + j).to(tl.float32) * k_a
        g_w_j = tl.load(g_w + n * DV + j).to(tl.float32) if HAS_G_W else 0.0
        G_j, g_v_j, g_b_j, g_r_j, g_k_j = _channel_backward(G_j, X_j, k, b, r, tl.load(v + n * DV + j).to(tl.float32),
                                                             tl.load(q + n * DV + j).to(tl.float32), g_w_j)
        tl.store(G_mid + (n * DV + j) * d + i, G_j.to(G_mid.dtype.element_ty), mask=in_d)
        tl.store(g_v + n * DV + j, g_v_j.to(g_v.dtype.element_ty))
        g_b, g_r, g_k = g_b + g_b_j, g_r + g_r_j, g_k + g_k_j
    tl.store(g_h + n * d + i, (g_k - g_r * r * r * r * k).to(g_h.dtype.element_ty), mask=in_d)
    tl.store(g_beta + n, g_b.to(g_beta.dtype.element_ty))


# ---- a DeltaProduct sublayer's S updates: one program per token, its tile in registers from step to step;
# the steps' inputs stacked by step, h (B,T,S,d), beta (B,T,S), v, w, q (B,T,S,dv), rho (B,T,S) ----

@triton.jit
def _update_steps_forward_kernel(X, h, beta, v, X_new, w, rho, q, eps2, S, dv, d,
                                 BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    n, j, i, in_dv, in_d, tile, in_tile = _update_axes(dv, d, BLOCK_DV, BLOCK_D)
    X_n = tl.load(X + tile, mask=in_tile, other=0.0).to(tl.float32)
    for s in range(S):
        row = n * S + s
        k, b, v_n = _step_inputs(h, beta, v, row, j, i, in_dv, in_d, dv, d)
        X_n, w_n, r, q_n = _step_forward(X_n, k, b, v_n, eps2)
        tl.store(w + row * dv + j, w_n.to(w.dtype.element_ty), mask=in_dv)
        tl.store(q + row * dv + j, q_n.to(q.dtype.element_ty), mask=in_dv)
        tl.store(rho + row, r.to(rho.dtype.element_ty))
    tl.store(X_new + tile, X_n.to(X_new.dtype.element_ty), mask=in_tile)


@triton.jit
def _update_steps_backward_kernel(G, g_w, X, h, beta, v, rho, q, g_X, g_h, g_beta, g_v, S, dv, d,
                                  HAS_G_W: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """The steps' backwards in reverse, dL/dX_s carried in registers; the state before step s recomputed as
    X + sum over p < s of w_p k~_p^T (w_p from the saved rho and q), never stored."""
    n, j, i, in_dv, in_d, tile, in_tile = _update_axes(dv, d, BLOCK_DV, BLOCK_D)
    X_0 = tl.load(X + tile, mask=in_tile, other=0.0).to(tl.float32)
    G_n = tl.load(G + tile, mask=in_tile, other=0.0).to(tl.float32)
    for back in range(S):
        s = S - 1 - back
        X_n = X_0
        for p in range(s):
            k_p, b_p, v_p = _step_inputs(h, beta, v, n * S + p, j, i, in_dv, in_d, dv, d)
            r_p = tl.load(rho + n * S + p).to(tl.float32)
            q_p = tl.load(q + (n * S + p) * dv + j, mask=in_dv, other=0.0).to(tl.float32)
            X_n += (b_p * r_p * (v_p - r_p * q_p))[:, None] * k_p[None, :]
        row = n * S + s
        k, b, v_n = _step_inputs(h, beta, v, row, j, i, in_dv, in_d, dv, d)
        r, q_n, g_w_n = _step_saved(rho, q, g_w, row, j, in_dv, dv, HAS_G_W)
        G_n, g_k, g_b, g_res = _step_backward(G_n, g_w_n, X_n, k, b, v_n, r, q_n)
        _store_step_grads(g_h, g_beta, g_v, g_k, g_b, g_res, row, j, i, in_dv, in_d, dv, d)
    tl.store(g_X + tile, G_n.to(g_X.dtype.element_ty), mask=in_tile)


# ---- the depthwise ops: tiles (lag, channel j, feature i) of one token and block of features ----

@triton.jit
def _axes(L, dv, d, BLOCK_L: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """The lag, channel and feature index vectors of this program's block, and their masks."""
    lag, j = tl.arange(0, BLOCK_L), tl.arange(0, BLOCK_DV)
    i = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    return lag, j, i, lag < L, j < dv, i < d


@triton.jit
def _taps(A, lag, j, i, in_L, in_dv, in_d, L, d):
    """The taps (lag, j, i) = A[j, i, L-1-lag] as fp32; A (dv,d,L) contiguous."""
    offsets = (j[None, :, None] * d + i[None, None, :]) * L + (L - 1 - lag[:, None, None])
    mask = in_L[:, None, None] & in_dv[None, :, None] & in_d[None, None, :]
    return tl.load(A + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _rows_at(x, n, shift, valid, i, in_d, d):
    """Rows x[n + shift] (one per lag) of a (N,d) tensor where `valid`, else 0: (lags, features) fp32."""
    offsets = (n + shift[:, None]) * d + i[None, :]
    return tl.load(x + offsets, mask=valid[:, None] & in_d[None, :], other=0.0).to(tl.float32)


@triton.jit
def _chunk_start(N, L, dv, d, TOKENS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_DV: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """A backward program's axes (as _axes), a zero (lag, j, i) accumulator for its taps' gradient, and its
    chunk's tokens [first, last)."""
    lag, j, i, in_L, in_dv, in_d = _axes(L, dv, d, BLOCK_L, BLOCK_DV, BLOCK_D)
    first = tl.program_id(0).to(tl.int64) * TOKENS
    acc = tl.zeros((BLOCK_L, BLOCK_DV, BLOCK_D), dtype=tl.float32)
    return lag, j, i, in_L, in_dv, in_d, acc, first, tl.minimum(first + TOKENS, N)


@triton.jit
def _store_tap_partial(partials, acc, lag, j, i, in_L, in_dv, in_d, L, dv, d):
    """partials[chunk] (dv,d,L) <- this program's (lag, j, i) sum over its chunk's tokens, in tap order."""
    tap = L - 1 - lag[:, None, None]
    offsets = tl.program_id(0) * dv * d * L + (j[None, :, None] * d + i[None, None, :]) * L + tap
    tl.store(partials + offsets, acc, mask=in_L[:, None, None] & in_dv[None, :, None] & in_d[None, None, :])


@triton.jit
def _read_forward_kernel(X, A, x, T, L, dv, d, BLOCK_L: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """x[t] = sum over lag, j of A[j, :, L-1-lag] * X[t-lag, j]."""
    n = tl.program_id(0).to(tl.int64)
    lag, j, i, in_L, in_dv, in_d = _axes(L, dv, d, BLOCK_L, BLOCK_DV, BLOCK_D)
    seen = in_L & (lag <= n % T)                                  # t - lag within the sequence
    offsets = ((n - lag[:, None, None]) * dv + j[None, :, None]) * d + i[None, None, :]
    mask = seen[:, None, None] & in_dv[None, :, None] & in_d[None, None, :]
    X_seen = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    taps = _taps(A, lag, j, i, in_L, in_dv, in_d, L, d)
    tl.store(x + n * d + i, tl.sum(tl.sum(X_seen * taps, axis=0), axis=0).to(x.dtype.element_ty), mask=in_d)


@triton.jit
def _read_backward_kernel(g, X, A, g_X, partials, N, T, L, dv, d, TOKENS: tl.constexpr,
                          BLOCK_L: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """g_X[t, j] = sum over lag of A[j, :, L-1-lag] * g[t+lag]; the taps' partial sum_t X[t, j] * g[t+lag]."""
    lag, j, i, in_L, in_dv, in_d, acc, first, last = _chunk_start(N, L, dv, d, TOKENS, BLOCK_L, BLOCK_DV, BLOCK_D)
    taps = _taps(A, lag, j, i, in_L, in_dv, in_d, L, d)
    in_tile = in_dv[:, None] & in_d[None, :]
    for n in range(first, last):
        g_ahead = _rows_at(g, n, lag, in_L & (n % T + lag < T), i, in_d, d)      # g[t + lag] (lag, i)
        tile = (n * dv + j[:, None]) * d + i[None, :]
        X_n = tl.load(X + tile, mask=in_tile, other=0.0).to(tl.float32)
        tl.store(g_X + tile, tl.sum(taps * g_ahead[:, None, :], axis=0).to(g_X.dtype.element_ty), mask=in_tile)
        acc += X_n[None, :, :] * g_ahead[:, None, :]
    _store_tap_partial(partials, acc, lag, j, i, in_L, in_dv, in_d, L, dv, d)


@triton.jit
def _expand_forward_kernel(x, E, X, T, L, dv, d, BLOCK_L: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """X[t, j] = sum over lag of E[j, :, L-1-lag] * x[t-lag]."""
    n = tl.program_id(0).to(tl.int64)
    lag, j, i, in_L, in_dv, in_d = _axes(L, dv, d, BLOCK_L, BLOCK_DV, BLOCK_D)
    x_seen = _rows_at(x, n, -lag, in_L & (lag <= n % T), i, in_d, d)
    taps = _taps(E, lag, j, i, in_L, in_dv, in_d, L, d)
    tile = (n * dv + j[:, None]) * d + i[None, :]
    tl.store(X + tile, tl.sum(taps * x_seen[:, None, :], axis=0).to(X.dtype.element_ty),
             mask=in_dv[:, None] & in_d[None, :])


@triton.jit
def _expand_backward_kernel(g, x, E, g_x, partials, N, T, L, dv, d, TOKENS: tl.constexpr,
                            BLOCK_L: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """g_x[t] = sum over lag, j of E[j, :, L-1-lag] * g[t+lag, j]; the taps' partial sum_t g[t+lag, j] * x[t]."""
    lag, j, i, in_L, in_dv, in_d, acc, first, last = _chunk_start(N, L, dv, d, TOKENS, BLOCK_L, BLOCK_DV, BLOCK_D)
    taps = _taps(E, lag, j, i, in_L, in_dv, in_d, L, d)
    for n in range(first, last):
        ahead = in_L & (n % T + lag < T)
        offsets = ((n + lag[:, None, None]) * dv + j[None, :, None]) * d + i[None, None, :]
        mask = ahead[:, None, None] & in_dv[None, :, None] & in_d[None, None, :]
        g_ahead = tl.load(g + offsets, mask=mask, other=0.0).to(tl.float32)     # g[t + lag, j] (lag, j, i)
        x_n = tl.load(x + n * d + i, mask=in_d, other=0.0).to(tl.float32)
        tl.store(g_x + n * d + i, tl.sum(tl.sum(taps * g_ahead, axis=0), axis=0).to(g_x.dtype.element_ty), mask=in_d)
        acc += g_ahead * x_n[None, None, :]
    _store_tap_partial(partials, acc, lag, j, i, in_L, in_dv, in_d, L, dv, d)


# ---- tiles of TOKENS_PER_TILE tokens and a block of features: the rank-1 read and DeltaWrite's taps' gradient ----

@triton.jit
def _token_tile(N, d, TOK: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's tokens and features, and their masks."""
    n = tl.program_id(0).to(tl.int64) * TOK + tl.arange(0, TOK)
    i = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    in_n, in_d = n < N, i < d
    return n, i, in_n, in_d, in_n[:, None] & in_d[None, :]


@triton.jit
def _tile_rows(x, rows, valid, i, in_d, d):
    """Rows x[rows] of a (N, d) tensor where valid, else 0: (tokens, features) fp32."""
    return tl.load(x + rows[:, None] * d + i[None, :], mask=valid[:, None] & in_d[None, :], other=0.0).to(tl.float32)


@triton.jit
def _tap(A_lag, j, lag, i, in_d, dv, d):
    """The taps of channel j at one lag over this program's features, fp32; A_lag (L, dv, d) by lag."""
    return tl.load(A_lag + (lag * dv + j) * d + i, mask=in_d, other=0.0).to(tl.float32)


@triton.jit
def _store_tap_gradient(partials, value, j, lag, i, in_d, L, dv, d):
    """partials[tile, j, i, L-1-lag] <- this tile's sum over its tokens (each program writes each entry once)."""
    tl.store(partials + tl.program_id(0).to(tl.int64) * dv * d * L + (j * d + i) * L + (L - 1 - lag), value, mask=in_d)


@triton.jit
def _rank_one_forward_kernel(w, h, A_lag, x, N, T, L, dv, d, TOK: tl.constexpr, BLOCK_D: tl.constexpr):
    """x[t] = sum over lag of (sum_j w[t-lag, j] A[j, :, L-1-lag]) * k~[t-lag]."""
    n, i, in_n, in_d, in_tile = _token_tile(N, d, TOK, BLOCK_D)
    out = tl.zeros((TOK, BLOCK_D), dtype=tl.float32)
    for lag in range(L):
        seen = in_n & (lag <= n % T)
        src = n - lag
        coefficient = tl.zeros((TOK, BLOCK_D), dtype=tl.float32)
        for j in range(dv):
            w_j = tl.load(w + src * dv + j, mask=seen, other=0.0).to(tl.float32)
            coefficient += w_j[:, None] * _tap(A_lag, j, lag, i, in_d, dv, d)[None, :]
        out += coefficient * _tile_rows(h, src, seen, i, in_d, d)
    tl.store(x + n[:, None] * d + i[None, :], out.to(x.dtype.element_ty), mask=in_tile)


@triton.jit
def _rank_one_backward_kernel(g, w, h, A_lag, g_w_partials, g_h, partials, N, T, L, dv, d, TOK: tl.constexpr,
                              BLOCK_DV: tl.constexpr, BLOCK_D: tl.constexpr):
    """With P = g[t+lag] * k~[t]: g_k~[t] = sum over lag of g[t+lag] (sum_j w[t, j] A_lag[j]), this feature block's
    share of g_w[t, j] = sum over lag, i of P A_lag[j], and this tile's sum_t w[t, j] P per tap."""
    n, i, in_n, in_d, in_tile = _token_tile(N, d, TOK, BLOCK_D)
    jj = tl.arange(0, BLOCK_DV)
    k = _tile_rows(h, n, in_n, i, in_d, d)
    g_k = tl.zeros((TOK, BLOCK_D), dtype=tl.float32)
    g_w = tl.zeros((TOK, BLOCK_DV), dtype=tl.float32)
    for lag in range(L):
        g_ahead = _tile_rows(g, n + lag, in_n & (n % T + lag < T), i, in_d, d)
        P = g_ahead * k
        coefficient = tl.zeros((TOK, BLOCK_D), dtype=tl.float32)
        for j in range(dv):
            a = _tap(A_lag, j, lag, i, in_d, dv, d)
            w_j = tl.load(w + n * dv + j, mask=in_n, other=0.0).to(tl.float32)
            coefficient += w_j[:, None] * a[None, :]
            g_w += tl.where(jj[None, :] == j, tl.sum(P * a[None, :], axis=1)[:, None], 0.0)
            _store_tap_gradient(partials, tl.sum(w_j[:, None] * P, axis=0), j, lag, i, in_d, L, dv, d)
        g_k += g_ahead * coefficient
    tl.store(g_h + n[:, None] * d + i[None, :], g_k.to(g_h.dtype.element_ty), mask=in_tile)
    tl.store(g_w_partials + (tl.program_id(1) * N + n[:, None]) * dv + jj[None, :], g_w,
             mask=in_n[:, None] & (jj < dv)[None, :])


@triton.jit
def _write_taps_kernel(g_next, X, h_a, w_a, h, beta, v, rho, q, partials, sXn, sXj, N, T, L, dv, d,
                       TOK: tl.constexpr, BLOCK_D: tl.constexpr):
    """DeltaWrite's taps' gradient, this tile's sum_t X_out[t, j] * g_next[t+lag] per tap, with
    X_out = X + w_a k~_a^T + w k~^T rebuilt per feature block (w = beta rho (v - rho q) from the saved rho, q)."""
    n, i, in_n, in_d, in_tile = _token_tile(N, d, TOK, BLOCK_D)
    k_a, k = _tile_rows(h_a, n, in_n, i, in_d, d), _tile_rows(h, n, in_n, i, in_d, d)
    b = tl.load(beta + n, mask=in_n, other=0.0).to(tl.float32)
    r = tl.load(rho + n, mask=in_n, other=0.0).to(tl.float32)
    for j in range(dv):
        w_aj = tl.load(w_a + n * dv + j, mask=in_n, other=0.0).to(tl.float32)
        v_j = tl.load(v + n * dv + j, mask=in_n, other=0.0).to(tl.float32)
        q_j = tl.load(q + n * dv + j, mask=in_n, other=0.0).to(tl.float32)
        X_j = tl.load(X + n[:, None] * sXn + j * sXj + i[None, :], mask=in_tile, other=0.0).to(tl.float32)
        out = X_j + w_aj[:, None] * k_a + (b * r * (v_j - r * q_j))[:, None] * k
        for lag in range(L):
            g_ahead = _tile_rows(g_next, n + lag, in_n & (n % T + lag < T), i, in_d, d)
            _store_tap_gradient(partials, tl.sum(out * g_ahead, axis=0), j, lag, i, in_d, L, dv, d)


# ---- a sublayer's RMSNorm with the gates' maps of its output and input (norm_projections): one row a program ----

@triton.jit
def _gate_forward(l, b, k, in_k, s, GATED: tl.constexpr):
    """A gate's activation of its map l (see C++ Gate): s sigmoid(l + b) where GATED, else l."""
    if GATED:
        return s * tl.sigmoid(l + tl.load(b + k, mask=in_k, other=0.0).to(tl.float32))
    return l


@triton.jit
def _gate_backward(g_y, y, s, GATED: tl.constexpr):
    """dL/dl from dL/dy and the gate's output y: y (1 - y / s) where GATED."""
    if GATED:
        return g_y * y * (1.0 - y / s)
    return g_y


@triton.jit
def _norm_forward_kernel(x, g, W_c, W_x, b_c, b_x, s_c, s_x, c, y_c, y_x, rho, eps, nc, nx, d, GATED_C: tl.constexpr,
                         GATED_X: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_D: tl.constexpr):
    """c = x rho g, rho = 1/sqrt(mean(x^2) + eps); y_c = gate_c(c W_c^T) and y_x = gate_x(x W_x^T) from the fp32 c
    and x."""
    n, i, in_d = _token_row(d, BLOCK_D)
    x_n = _vec(x, n, i, in_d, d)
    r = 1.0 / tl.sqrt(tl.sum(x_n * x_n) / d + eps)
    c_n = x_n * r * tl.load(g + i, mask=in_d, other=0.0).to(tl.float32)
    tl.store(c + n * d + i, c_n.to(c.dtype.element_ty), mask=in_d)
    tl.store(rho + n, r)
    kc, kx = tl.arange(0, BLOCK_C), tl.arange(0, BLOCK_X)
    W_cn = tl.load(W_c + kc[:, None] * d + i[None, :], mask=(kc < nc)[:, None] & in_d[None, :], other=0.0)
    l_c = tl.sum(W_cn.to(tl.float32) * c_n[None, :], axis=1)
    tl.store(y_c + n * nc + kc, _gate_forward(l_c, b_c, kc, kc < nc, s_c, GATED_C), mask=kc < nc)
    W_xn = tl.load(W_x + kx[:, None] * d + i[None, :], mask=(kx < nx)[:, None] & in_d[None, :], other=0.0)
    l_x = tl.sum(W_xn.to(tl.float32) * x_n[None, :], axis=1)
    tl.store(y_x + n * nx + kx, _gate_forward(l_x, b_x, kx, kx < nx, s_x, GATED_X), mask=kx < nx)


@triton.jit
def _norm_backward_kernel(g_c, g_yc, g_yx, x, g, W_c, W_x, rho, y_c, y_x, s_c, s_x, g_x, partials, bias_partials, N,
                          nc, nx, d, TOKENS: tl.constexpr, GATED_C: tl.constexpr, GATED_X: tl.constexpr,
                          BLOCK_C: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_D: tl.constexpr):
    """dL/dx per token; this chunk's partial sums of dL/dg, dL/dW_c, dL/dW_x, stored (1 + nc + nx, d) at
    partials[chunk], and of the gates' dL/db_c, dL/db_x, (nc + nx) at bias_partials[chunk]. With a = dL/dl (through
    the gates) and G = dL/dc + W_c^T a_c: dL/dx = rho G g - rho^3 x (G g . x) / d + W_x^T a_x."""
    i = tl.arange(0, BLOCK_D)
    in_d = i < d
    kc, kx = tl.arange(0, BLOCK_C), tl.arange(0, BLOCK_X)
    in_c, in_x = (kc < nc)[:, None] & in_d[None, :], (kx < nx)[:, None] & in_d[None, :]
    gain = tl.load(g + i, mask=in_d, other=0.0).to(tl.float32)
    W_cn = tl.load(W_c + kc[:, None] * d + i[None, :], mask=in_c, other=0.0).to(tl.float32)
    W_xn = tl.load(W_x + kx[:, None] * d + i[None, :], mask=in_x, other=0.0).to(tl.float32)
    g_gain = tl.zeros((BLOCK_D,), dtype=tl.float32)
    g_Wc = tl.zeros((BLOCK_C, BLOCK_D), dtype=tl.float32)
    g_Wx = tl.zeros((BLOCK_X, BLOCK_D), dtype=tl.float32)
    g_bc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    g_bx = tl.zeros((BLOCK_X,), dtype=tl.float32)
    first = tl.program_id(0).to(tl.int64) * TOKENS
    for n in range(first, tl.minimum(first + TOKENS, N)):
        x_n = tl.load(x + n * d + i, mask=in_d, other=0.0).to(tl.float32)
        r = tl.load(rho + n).to(tl.float32)
        a_c = _gate_backward(tl.load(g_yc + n * nc + kc, mask=kc < nc, other=0.0).to(tl.float32),
                             tl.load(y_c + n * nc + kc, mask=kc < nc, other=0.0).to(tl.float32), s_c, GATED_C)
        a_x = _gate_backward(tl.load(g_yx + n * nx + kx, mask=kx < nx, other=0.0).to(tl.float32),
                             tl.load(y_x + n * nx + kx, mask=kx < nx, other=0.0).to(tl.float32), s_x, GATED_X)
        G = tl.load(g_c + n * d + i, mask=in_d, other=0.0).to(tl.float32) + tl.sum(a_c[:, None] * W_cn, axis=0)
        slope = -r * r * r * tl.sum(G * gain * x_n) / d
        g_x_n = r * G * gain + slope * x_n + tl.sum(a_x[:, None] * W_xn, axis=0)
        tl.store(g_x + n * d + i, g_x_n.to(g_x.dtype.element_ty), mask=in_d)
        g_gain += G * x_n * r
        g_Wc += (a_c * r)[:, None] * (x_n * gain)[None, :]
        g_Wx += a_x[:, None] * x_n[None, :]
        g_bc += a_c
        g_bx += a_x
    chunk = tl.program_id(0).to(tl.int64)
    rows = partials + chunk * (1 + nc + nx) * d
    tl.store(rows + i, g_gain, mask=in_d)
    tl.store(rows + (1 + kc[:, None]) * d + i[None, :], g_Wc, mask=in_c)
    tl.store(rows + (1 + nc + kx[:, None]) * d + i[None, :], g_Wx, mask=in_x)
    tl.store(bias_partials + chunk * (nc + nx) + kc, g_bc, mask=kc < nc)
    tl.store(bias_partials + chunk * (nc + nx) + nc + kx, g_bx, mask=kx < nx)


# ---- the ops ----

def _update_grid(dv: int, d: int) -> dict:
    """Block sizes and warps for the DeltaProduct steps' (dv, d) tile: about 8 fp32 values of each tile a thread."""
    block_dv, block_d = triton.next_power_of_2(dv), triton.next_power_of_2(d)
    return dict(BLOCK_DV=block_dv, BLOCK_D=block_d, num_warps=min(16, max(1, block_dv * block_d // 256)))


def _row_grid(dv: int, d: int) -> dict:
    """The row kernels' channels, block of features and warps."""
    return dict(DV=dv, BLOCK_D=triton.next_power_of_2(d), num_warps=ROW_WARPS)


def _block_d(d: int) -> int:
    return min(FEATURES_PER_BLOCK, triton.next_power_of_2(d))


def _by_token(kernel, tensors: tuple, B: int, T: int, L: int, dv: int, d: int) -> None:
    """Launches a depthwise forward: kernel(*tensors, T, L, dv, d), one program per token and block of features."""
    blocks = dict(BLOCK_L=triton.next_power_of_2(L), BLOCK_DV=triton.next_power_of_2(dv), BLOCK_D=_block_d(d))
    wrap_triton(kernel)[(B * T, triton.cdiv(d, _block_d(d)))](*tensors, T, L, dv, d, **blocks)


def _by_chunk(kernel, tensors: tuple, taps: torch.Tensor, B: int, T: int, dv: int, d: int,
              strides: tuple = ()) -> torch.Tensor:
    """Launches a depthwise backward: kernel(*tensors, partials, *strides, N, T, L, dv, d), one program per chunk of
    tokens and block of features; returns the taps' gradient, the chunks' partials summed in order."""
    L = taps.size(-1)
    chunks = triton.cdiv(B * T, TOKENS_PER_CHUNK)
    partials = taps.new_empty((chunks, *taps.shape), dtype=torch.float32)
    blocks = dict(BLOCK_L=triton.next_power_of_2(L), BLOCK_DV=triton.next_power_of_2(dv), BLOCK_D=_block_d(d))
    wrap_triton(kernel)[(chunks, triton.cdiv(d, _block_d(d)))](*tensors, partials, *strides, B * T, T, L, dv, d,
                                                                 TOKENS=TOKENS_PER_CHUNK, **blocks)
    return partials.sum(0).to(taps.dtype)


TOKENS_PER_TILE = 32        # tokens a tiled program covers: the token sums' partials, in tile order
TILE_FEATURES = 128         # features a tiled program covers where they set the size of a partial
TILED_OPS = ("write_backward", "rank_one_forward", "rank_one_backward")   # the ops that launch a kernel by _by_tile


def _by_tile(kernel, tensors: tuple, N: int, d: int, **blocks) -> None:
    """Launches a tiled kernel, kernel(*tensors, ..., TOK, BLOCK_D): one program per tile of tokens and features."""
    block_d = _tile_features(d)
    kernel[(triton.cdiv(N, TOKENS_PER_TILE), triton.cdiv(d, block_d))](*tensors, TOK=TOKENS_PER_TILE, BLOCK_D=block_d,
                                                                          num_warps=TILE_WARPS, **blocks)


def _tap_partials(taps: torch.Tensor, N: int) -> torch.Tensor:
    """One (dv, d, L) fp32 partial of the taps' gradient per tile of tokens."""
    return taps.new_empty((triton.cdiv(N, TOKENS_PER_TILE), *taps.shape), dtype=torch.float32)


def _tile_features(d: int) -> int:
    return min(TILE_FEATURES, triton.next_power_of_2(d))


def _feature_blocks(d: int) -> int:
    return triton.cdiv(d, _tile_features(d))


# Custom ops, opaque to torch.compile: one kernel a direction leaves inductor nothing to fuse, and their fakes give
# the shapes without tracing the kernel (which under the interpreter would launch it on fake tensors).

def _update_outputs(X: torch.Tensor, S: int | None = None) -> tuple[torch.Tensor, ...]:
    """Empty X_new (X's dtype and shape, contiguous), and w, rho, q (in at least fp32) of one update (S None) or of S
    steps stacked by step."""
    B, T, dv, d = X.shape
    steps, acc = () if S is None else (S,), torch.promote_types(X.dtype, torch.float32)
    return (X.new_empty(X.shape), X.new_empty(B, T, *steps, dv, dtype=acc), X.new_empty(B, T, S or 1, dtype=acc),
            X.new_empty(B, T, *steps, dv, dtype=acc))


def _by_lag(A: torch.Tensor) -> torch.Tensor:
    """Taps (dv, d, L), tap L-1 the current token's, as (L, dv, d) by lag, contiguous."""
    return A.flip(-1).permute(2, 0, 1).contiguous()


def _state_strides(X: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """X as the kernels read it, with its token and channel strides: as it is when its features are contiguous and its
    tokens evenly spaced (a repeated embedding: channel stride 0), else a contiguous copy."""
    B, T, dv, d = X.shape
    if X.stride(3) != 1 or X.stride(0) != T * X.stride(1):
        X = X.contiguous()
    return X, X.stride(1), X.stride(2)


def _update_grads(G: torch.Tensor, h: torch.Tensor, beta: torch.Tensor, v: torch.Tensor,
                  S: int | None = None) -> tuple[torch.Tensor, ...]:
    """Empty dL/dX, dL/dk~, dL/dbeta, dL/dv of one update (S None) or of S steps stacked by step, each in the dtype
    of what it is the gradient of (dL/dX: G's)."""
    B, T, dv, d = G.shape
    steps = () if S is None else (S,)
    return (G.new_empty(G.shape), G.new_empty(B, T, *steps, d, dtype=h.dtype),
            G.new_empty(B, T, S or 1, dtype=beta.dtype), G.new_empty(B, T, *steps, dv, dtype=v.dtype))


@custom_op("ddl_triton::update_forward", mutates_args=())
def update_forward(X: torch.Tensor, h: torch.Tensor, beta: torch.Tensor, v: torch.Tensor,
                   eps2: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """X + w k~^T, w, rho, q = X k~ (see eager.update_forward)."""
    (X, sXn, sXj), (h, beta, v) = _state_strides(X), (t.contiguous() for t in (h, beta, v))
    B, T, dv, d = X.shape
    X_new, w, rho, q = outputs = _update_outputs(X)
    _update_forward_kernel[(B * T,)](X, h, beta, v, X_new, w, rho, q, eps2, sXn, sXj, d, STORE_STATE=True,
                                     **_row_grid(dv, d))
    return outputs


@update_forward.register_fake
def _(X, h, beta, v, eps2):
    return _update_outputs(X)


@custom_op("ddl_triton::update_backward", mutates_args=())
def update_backward(G: torch.Tensor, g_w: Optional[torch.Tensor], X: torch.Tensor, h: torch.Tensor, beta: torch.Tensor,
                    v: torch.Tensor, rho: torch.Tensor,
                    q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of update_forward's (X_new, w) for X, h, beta, v; g_w = dL/dw or None."""
    (X, sXn, sXj), (G, h, beta, v, rho, q) = _state_strides(X), (t.contiguous() for t in (G, h, beta, v, rho, q))
    has_g_w = g_w is not None
    g_w = g_w.contiguous() if has_g_w else G                      # not read when absent
    B, T, dv, d = X.shape
    g_X, g_h, g_beta, g_v = grads = _update_grads(G, h, beta, v)
    _update_backward_kernel[(B * T,)](G, g_w, X, h, beta, v, rho, q, g_X, g_h, g_beta, g_v, sXn, sXj, d,
                                      HAS_G_W=has_g_w, **_row_grid(dv, d))
    return grads


@update_backward.register_fake
def _(G, g_w, X, h, beta, v, rho, q):
    return _update_grads(G, h, beta, v)


@custom_op("ddl_triton::key_forward", mutates_args=())
def key_forward(X: torch.Tensor, h: torch.Tensor, beta: torch.Tensor, v: torch.Tensor,
                eps2: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w, rho, q of update_forward, the new state not written (DeltaKey)."""
    (X, sXn, sXj), (h, beta, v) = _state_strides(X), (t.contiguous() for t in (h, beta, v))
    B, T, dv, d = X.shape
    _, w, rho, q = _update_outputs(X)
    _update_forward_kernel[(B * T,)](X, h, beta, v, X, w, rho, q, eps2, sXn, sXj, d, STORE_STATE=False,
                                     **_row_grid(dv, d))
    return w, rho, q


@key_forward.register_fake
def _(X, h, beta, v, eps2):
    return _update_outputs(X)[1:]


def _write_outputs(X: torch.Tensor, store_state: bool) -> tuple[torch.Tensor, ...]:
    """Empty X_out (X's shape, or none), w, rho, q and x_next (at least fp32) of write_forward."""
    _, w, rho, q = _update_outputs(X)
    B, T, dv, d = X.shape
    return X.new_empty(X.shape if store_state else (0,)), w, rho, q, X.new_empty(B, T, d, dtype=w.dtype)


@custom_op("ddl_triton::write_forward", mutates_args=())
def write_forward(X: torch.Tensor, h_a: torch.Tensor, w_a: torch.Tensor, h: torch.Tensor, beta: torch.Tensor,
                  v: torch.Tensor, A: torch.Tensor, eps2: float,
                  store_state: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """X_out (empty unless store_state), w, rho, q, x_next (see eager.write_forward)."""
    (X, sXn, sXj), others = _state_strides(X), [t.contiguous() for t in (h_a, w_a, h, beta, v)] + [_by_lag(A)]
    B, T, dv, d = X.shape
    X_out, w, rho, q, x_next = outputs = _write_outputs(X, store_state)
    _write_forward_kernel[(B * T,)](X, *others, X_out, w, rho, q, x_next, eps2, sXn, sXj, T, d, STORE_STATE=store_state,
                                    L=A.size(-1), **_row_grid(dv, d))
    return outputs


@write_forward.register_fake
def _(X, h_a, w_a, h, beta, v, A, eps2, store_state):
    return _write_outputs(X, store_state)


@custom_op("ddl_triton::write_backward", mutates_args=())
def write_backward(G: Optional[torch.Tensor], g_w: Optional[torch.Tensor], g_next: torch.Tensor, X: torch.Tensor,
                   h_a: torch.Tensor, w_a: torch.Tensor, h: torch.Tensor, beta: torch.Tensor, v: torch.Tensor,
                   rho: torch.Tensor, q: torch.Tensor,
                   A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dL/dX_mid, dL/dk~, dL/dbeta, dL/dv, dL/dA of write_forward (see eager.write_backward); G None: X_out unused."""
    (X, sXn, sXj), inputs = _state_strides(X), [t.contiguous() for t in (g_next, h_a, w_a, h, beta, v, rho, q, A)]
    g_next, h_a, w_a, h, beta, v, rho, q, A = inputs
    has_g, has_g_w = G is not None, g_w is not None
    G = G.contiguous() if has_g else g_next                       # not read when absent
    g_w = g_w.contiguous() if has_g_w else g_next
    B, T, dv, d = X.shape
    G_mid, g_h, g_beta, g_v = _update_grads(X, h, beta, v)
    _write_backward_kernel[(B * T,)](G, g_w, g_next, X, h_a, w_a, h, beta, v, rho, q, _by_lag(A), G_mid, g_h, g_beta,
                                     g_v, sXn, sXj, T, d, HAS_G=has_g, HAS_G_W=has_g_w, L=A.size(-1),
                                     **_row_grid(dv, d))
    partials = _tap_partials(A, B * T)
    _by_tile(_write_taps_kernel, (g_next, X, h_a, w_a, h, beta, v, rho, q, partials, sXn, sXj, B * T, T, A.size(-1),
                                  dv, d), B * T, d)
    return G_mid, g_h, g_beta, g_v, partials.sum(0).to(A.dtype)


@write_backward.register_fake
def _(G, g_w, g_next, X, h_a, w_a, h, beta, v, rho, q, A):
    return (*_update_grads(X, h, beta, v), A.new_empty(A.shape))


def _stacked(h: list[torch.Tensor], beta: list[torch.Tensor], v: list[torch.Tensor]) -> list[torch.Tensor]:
    """The steps' inputs stacked by step: h (B,T,S,d), beta (B,T,S), v (B,T,S,dv)."""
    return [torch.stack(h, 2), torch.cat(beta, -1), torch.stack(v, 2)]


@custom_op("ddl_triton::update_steps_forward", mutates_args=())
def update_steps_forward(X: torch.Tensor, h: list[torch.Tensor], beta: list[torch.Tensor], v: list[torch.Tensor],
                         eps2: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """X_S, and w (B,T,S,dv), rho (B,T,S), q (B,T,S,dv) by step (see eager.update_steps_forward)."""
    X = X.contiguous()
    B, T, dv, d = X.shape
    S = len(h)
    X_new, w, rho, q = outputs = _update_outputs(X, S)
    _update_steps_forward_kernel[(B * T,)](X, *_stacked(h, beta, v), X_new, w, rho, q, eps2, S, dv, d,
                                           **_update_grid(dv, d))
    return outputs


@update_steps_forward.register_fake
def _(X, h, beta, v, eps2):
    return _update_outputs(X, len(h))


@custom_op("ddl_triton::update_steps_backward", mutates_args=())
def update_steps_backward(G: torch.Tensor, g_w: Optional[torch.Tensor], X: torch.Tensor, h: list[torch.Tensor],
                          beta: list[torch.Tensor], v: list[torch.Tensor], rho: torch.Tensor,
                          q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of update_steps_forward's (X_S, w) for X and the steps' k~, beta, v, stacked by step."""
    G, X, rho, q = (t.contiguous() for t in (G, X, rho, q))
    has_g_w = g_w is not None
    g_w = g_w.contiguous() if has_g_w else G                      # not read when absent
    B, T, dv, d = X.shape
    S = len(h)
    g_X, g_h, g_beta, g_v = grads = _update_grads(G, h[0], beta[0], v[0], S)
    _update_steps_backward_kernel[(B * T,)](G, g_w, X, *_stacked(h, beta, v), rho, q, g_X, g_h, g_beta, g_v, S, dv, d,
                                            HAS_G_W=has_g_w, **_update_grid(dv, d))
    return grads


@update_steps_backward.register_fake
def _(G, g_w, X, h, beta, v, rho, q):
    return _update_grads(G, h[0], beta[0], v[0], len(h))


NORM_TOKENS_PER_CHUNK = 32   # tokens a norm backward program sums the weights' gradients over, in order


def _norm_blocks(W_c: torch.Tensor, W_x: torch.Tensor, d: int) -> dict:
    return dict(BLOCK_C=triton.next_power_of_2(max(W_c.size(0), 1)),
                BLOCK_X=triton.next_power_of_2(max(W_x.size(0), 1)), BLOCK_D=triton.next_power_of_2(d))


def _norm_outputs(x: torch.Tensor, W_c: torch.Tensor, W_x: torch.Tensor, c_dtype: torch.dtype):
    acc = torch.promote_types(x.dtype, torch.float32)
    rows = x.shape[:-1]
    return (x.new_empty(x.shape, dtype=c_dtype), x.new_empty(*rows, W_c.size(0), dtype=acc),
            x.new_empty(*rows, W_x.size(0), dtype=acc), x.new_empty(*rows, 1, dtype=acc))


@custom_op("ddl_triton::norm_forward", mutates_args=())
def norm_forward(x: torch.Tensor, g: torch.Tensor, W_c: torch.Tensor, W_x: torch.Tensor, b_c: Optional[torch.Tensor],
                 b_x: Optional[torch.Tensor], s_c: float, s_x: float, eps: float,
                 c_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """c (in c_dtype), y_c, y_x, rho (at least fp32) of a sublayer's norm and its gates (see C++ norm_forward)."""
    x, g, W_c, W_x = (t.contiguous() for t in (x, g, W_c, W_x))
    d = x.size(-1)
    c, y_c, y_x, rho = outputs = _norm_outputs(x, W_c, W_x, c_dtype)
    _norm_forward_kernel[(x.numel() // d,)](x, g, W_c, W_x, _gate_biases(b_c, W_c), _gate_biases(b_x, W_x), s_c, s_x,
                                            c, y_c, y_x, rho, eps, W_c.size(0), W_x.size(0), d,
                                            GATED_C=b_c is not None, GATED_X=b_x is not None,
                                            **_norm_blocks(W_c, W_x, d), num_warps=NORM_WARPS)
    return outputs


@norm_forward.register_fake
def _(x, g, W_c, W_x, b_c, b_x, s_c, s_x, eps, c_dtype):
    return _norm_outputs(x, W_c, W_x, c_dtype)


def _gate_biases(b: Optional[torch.Tensor], ungated: torch.Tensor) -> torch.Tensor:
    """A gate's biases for the kernel; an ungated map's pointer is never read (`ungated` stands in)."""
    return ungated if b is None else b.contiguous()


@custom_op("ddl_triton::norm_backward", mutates_args=())
def norm_backward(g_c: torch.Tensor, g_yc: torch.Tensor, g_yx: torch.Tensor, x: torch.Tensor, g: torch.Tensor,
                  W_c: torch.Tensor, W_x: torch.Tensor, b_c: Optional[torch.Tensor], b_x: Optional[torch.Tensor],
                  s_c: float, s_x: float, rho: torch.Tensor, y_c: torch.Tensor,
                  y_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                              torch.Tensor]:
    """dL/dx, dL/dg, dL/dW_c, dL/dW_x, dL/db_c, dL/db_x (fp32 sums over tokens, by chunks in order; a bias's empty
    where its map is ungated) of norm_forward."""
    g_c, g_yc, g_yx, x, g, W_c, W_x, rho, y_c, y_x = (t.contiguous()
                                                      for t in (g_c, g_yc, g_yx, x, g, W_c, W_x, rho, y_c, y_x))
    d, nc, nx = x.size(-1), W_c.size(0), W_x.size(0)
    N = x.numel() // d
    chunks = triton.cdiv(N, NORM_TOKENS_PER_CHUNK)
    g_x = x.new_empty(x.shape)
    partials = x.new_empty(chunks, 1 + nc + nx, d, dtype=torch.float32)
    bias_partials = x.new_empty(chunks, nc + nx, dtype=torch.float32)
    _norm_backward_kernel[(chunks,)](g_c, g_yc, g_yx, x, g, W_c, W_x, rho, y_c, y_x, s_c, s_x, g_x, partials,
                                     bias_partials, N, nc, nx, d, TOKENS=NORM_TOKENS_PER_CHUNK,
                                     GATED_C=b_c is not None, GATED_X=b_x is not None, **_norm_blocks(W_c, W_x, d),
                                     num_warps=NORM_WARPS)
    g_b = bias_partials.sum(0)
    return (g_x, partials[:, 0].sum(0), partials[:, 1:1 + nc].sum(0), partials[:, 1 + nc:].sum(0),
            g_b[:nc if b_c is not None else 0].clone(), g_b[nc:nc + (nx if b_x is not None else 0)].clone())


@norm_backward.register_fake
def _(g_c, g_yc, g_yx, x, g, W_c, W_x, b_c, b_x, s_c, s_x, rho, y_c, y_x):
    return (x.new_empty(x.shape), *(t.new_empty(t.shape, dtype=torch.float32) for t in (g, W_c, W_x)),
            *(x.new_empty(0 if b is None else b.shape, dtype=torch.float32) for b in (b_c, b_x)))


@triton_op("ddl_triton::read_forward", mutates_args=())
def read_forward(X: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    X, A = X.contiguous(), A.contiguous()
    B, T, dv, d = X.shape
    x = X.new_empty(B, T, d)
    _by_token(_read_forward_kernel, (X, A, x), B, T, A.size(-1), dv, d)
    return x


@triton_op("ddl_triton::read_backward", mutates_args=())
def read_backward(g: torch.Tensor, X: torch.Tensor, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g, X, A = g.contiguous(), X.contiguous(), A.contiguous()
    B, T, dv, d = X.shape
    g_X = g.new_empty(X.shape)
    g_A = _by_chunk(_read_backward_kernel, (g, X, A, g_X), A, B, T, dv, d)
    return g_X, g_A


@custom_op("ddl_triton::rank_one_forward", mutates_args=())
def rank_one_forward(w: torch.Tensor, h: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """The read of the rank-1 state w k~^T from its factors, in w's dtype."""
    w, h, A = w.contiguous(), h.contiguous(), A.contiguous()
    B, T, d = h.shape
    x = w.new_empty(h.shape)
    _by_tile(_rank_one_forward_kernel, (w, h, _by_lag(A), x, B * T, T, A.size(-1), w.size(-1), d), B * T, d)
    return x


@rank_one_forward.register_fake
def _(w, h, A):
    return w.new_empty(h.shape)


@custom_op("ddl_triton::rank_one_backward", mutates_args=())
def rank_one_backward(g: torch.Tensor, w: torch.Tensor, h: torch.Tensor,
                      A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, w, h, A = g.contiguous(), w.contiguous(), h.contiguous(), A.contiguous()
    B, T, d = h.shape
    dv, N = w.size(-1), B * T
    g_h = h.new_empty(h.shape)
    g_w_partials = w.new_empty((_feature_blocks(d), B, T, dv), dtype=torch.float32)   # one per feature block
    partials = _tap_partials(A, N)
    _by_tile(_rank_one_backward_kernel, (g, w, h, _by_lag(A), g_w_partials, g_h, partials, N, T, A.size(-1), dv, d),
             N, d, BLOCK_DV=triton.next_power_of_2(dv))
    return g_w_partials.sum(0).to(w.dtype), g_h, partials.sum(0).to(A.dtype)


@rank_one_backward.register_fake
def _(g, w, h, A):
    return w.new_empty(w.shape), h.new_empty(h.shape), A.new_empty(A.shape)


@triton_op("ddl_triton::expand_forward", mutates_args=())
def expand_forward(x: torch.Tensor, E: torch.Tensor) -> torch.Tensor:
    x, E = x.contiguous(), E.contiguous()
    B, T, d = x.shape
    X = x.new_empty(B, T, E.size(0), d)
    _by_token(_expand_forward_kernel, (x, E, X), B, T, E.size(-1), E.size(0), d)
    return X


@triton_op("ddl_triton::expand_backward", mutates_args=())
def expand_backward(g: torch.Tensor, x: torch.Tensor, E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g, x, E = g.contiguous(), x.contiguous(), E.contiguous()
    B, T, d = x.shape
    g_x = g.new_empty(x.shape)
    g_E = _by_chunk(_expand_backward_kernel, (g, x, E, g_x), E, B, T, E.size(0), d)
    return g_x, g_E
