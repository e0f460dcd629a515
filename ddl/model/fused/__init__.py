"""The Delta residual's ops with hand-derived backwards (ModelConfig.kernels='fused').

The state's ops are autograd Functions, each tested against its plain PyTorch form in
ddl/model/delta.py, in value and gradient: a sublayer's update (DeltaUpdate, or DeltaProduct's steps),
a block's two updates when d_v > 1 (DeltaKey, then DeltaWrite with the next block's read), the read,
the rank-1 read and the EC expansion. Their loops run as C++ on CPU (cpu.cpp, built once per machine
by native.py: one pass over each tensor per op and direction, parallel over tokens), as Triton
kernels on CUDA (triton_loops.py, imported on first use there) and as PyTorch ops elsewhere or where
neither can run (eager.py, the same math op by op). Every reduction and update is computed in at
least fp32; the state is stored in its own dtype (ModelConfig.state_dtype: bf16 on CUDA by default).
Every loop takes its inputs in whatever dtypes they come in: the Triton kernels load each in its own, the C++ ops
and the PyTorch-op loops cast them to the computing dtype (the state's, at least fp32) themselves. For backward the
ops save their inputs as given and a few (B,T,dv) numbers; their gradients go back in the dtype the loops computed
them in, and autograd casts each to its input's (eagerly and compiled), so a Function's body is its loops' call.
norm_projections, a sublayer's RMSNorm with the gates' linear maps and activations, is one op too (C++,
Triton).
Eagerly on CPU, the ops every sublayer runs (the update, DeltaKey, DeltaWrite, the norm) are cpu.cpp's own autograd
ops: the same loops, saved tensors and gradients as the Python Functions here, without Python's Function machinery,
which is most of a small step's time (fused_update, fused_key, fused_write, norm_projections choose). torch.compile
traces the Python Functions.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch

from ..torch_private import assume_constant_result
from . import eager, native
from .eager import autocast_off  # noqa: F401 - the model's own autocast switch, re-exported

_emulating_cuda = False


@contextlib.contextmanager
def cuda_path():
    """Tensors of any device take the CUDA path (the Triton ops, a bf16 'auto' state): how ddl.traffic counts a GPU's
    step on fake CPU tensors."""
    global _emulating_cuda
    before, _emulating_cuda = _emulating_cuda, True
    try:
        yield
    finally:
        _emulating_cuda = before


def on_cuda_path(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" or _emulating_cuda


def loops_for(t: torch.Tensor):
    """The implementation of the loops for tensors like t: the C++ one on CPU when built, the Triton
    one on CUDA when triton imports (fp32 and narrower: it accumulates in fp32), else eager.
    DDL_NATIVE_KERNELS=0 (or native.eager_loops()) asks for eager everywhere. An op decides once, in forward, and
    keeps it for backward."""
    if t.is_cpu and not _emulating_cuda:                       # the common case first: each call costs microseconds
        return torch.ops.ddl_delta if _native() else eager
    if on_cuda_path(t) and t.dtype != torch.float64 and _triton():
        return torch.ops.ddl_triton
    return torch.ops.ddl_delta if _runs_cpp(t) else eager


_TRITON = torch.ops.ddl_triton     # the Triton loops' namespace (its ops registered when triton_loops is imported)


def state_dtype(setting: str, x: torch.Tensor) -> torch.dtype:
    """The dtype the state is stored in (ModelConfig.state_dtype) for a model whose embedding gives x: 'auto' is bf16
    on the CUDA path and x's dtype elsewhere (fp32; float64 in the parity tests)."""
    if setting == "auto":
        return torch.bfloat16 if on_cuda_path(x) and x.dtype != torch.float64 else x.dtype
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[setting]


def loops_name(t: torch.Tensor) -> str:
    """What runs the fused ops' loops for tensors like t, in words (for reports)."""
    return "C++" if _runs_cpp(t) else "PyTorch ops" if loops_for(t) is eager else "Triton"


def _runs_cpp(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and _native()


@assume_constant_result
def _native() -> bool:
    """Whether the C++ loops run on CPU: a constant to torch.compile, which builds them while tracing."""
    return native.enabled() and native.ops() is not None


@assume_constant_result
def _triton() -> bool:
    """Whether the Triton loops run on CUDA: a constant to torch.compile."""
    return native.enabled() and _triton_registered()


@functools.cache
def _triton_registered() -> bool:
    """Imports triton_loops (and with it triton), which registers torch.ops.ddl_triton; False after
    one warning where triton cannot be imported."""
    try:
        from . import triton_loops  # noqa: F401
    except ImportError as error:
        warnings.warn(f"ddl: the Triton Delta kernels cannot be loaded ({error}); the fused Delta kernels run as "
                      f"PyTorch ops on CUDA (slower, same numbers)", stacklevel=2)
        return False
    return True


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    """The dtype the Delta ops compute in: fp32, or the input's if wider (float64 in the tests)."""
    return torch.promote_types(dtype, torch.float32)


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in dtype, t itself when it is already: an autograd Function's output made by a no-op t.to(dtype)
    (an alias of t) got wrong gradients from torch.compile on CUDA (torch 2.11; make gpu-check)."""
    return t if t.dtype == dtype else t.to(dtype)


class FusedDeltaUpdate(torch.autograd.Function):
    """delta_update: (X, k~, beta, v, k_eps) -> (X + w k~^T, w), computed in at least fp32 whatever autocast says,
    the new state in X's dtype and w in the computing dtype.

    The key's normalisation k = k~ / sqrt(|k~|^2 + k_eps^2) happens inside: k is never materialised,
    and backward needs only the saved rho = 1/sqrt(|k~|^2 + k_eps^2) and q = X k~ (B,T,dv) beside
    the inputs. With res = v - k^T X and G, g_w the gradients of the outputs:
        dL/dw = G k~ + g_w     dL/dv = beta rho dL/dw     dL/dX = G - rho (dL/dv) k~^T
        dL/dbeta = rho res . dL/dw     dL/drho = beta res . dL/dw - q . dL/dv
        dL/dk~ = G^T w - rho X^T dL/dv - rho^3 k~ dL/drho
    """

    @staticmethod
    def forward(ctx, X, h, beta, v, k_eps: float):
        ctx.loops = loops_for(X)
        X_new, w, rho, q = ctx.loops.update_forward(X, h, beta, v, k_eps ** 2)
        ctx.save_for_backward(X, h, beta, v, rho, q)
        ctx.set_materialize_grads(False)                             # w's gradient, None where unused (d_v = 1)
        return cast(X_new, X.dtype), w

    @staticmethod
    def backward(ctx, G, g_w):
        return *_update_backward(ctx.loops, G, g_w, *ctx.saved_tensors), None


def _update_backward(loops, G, g_w, X, h, beta, v, rho, q) -> tuple[torch.Tensor, ...]:
    """The gradients of an update's X, k~, beta, v from what its forward saved (G, g_w None: unused)."""
    return loops.update_backward(X.new_zeros(()).expand(X.shape) if G is None else G, g_w, X, h, beta, v, rho, q)


class DeltaKey(torch.autograd.Function):
    """The first update of a block whose state has d_v > 1, X_mid = X + w_a k~_a^T, without writing X_mid, and the
    block's read of X_mid from the read of X: (X, k~_a, beta_a, v_a, x_in, A, k_eps) -> (w_a, H, x_in +
    rank_one_read(w_a, k~_a, A)). H, the mid state's handle, is a zero-strided tensor of X's shape whose value is never
    read: DeltaWrite rebuilds X_mid from X and the write's factors in registers, and returns dL/dX_mid as H's
    gradient, from which the backward here is FusedDeltaUpdate's, after the read's."""

    @staticmethod
    def forward(ctx, X, h, beta, v, x_in, A, k_eps: float):
        ctx.loops = loops = loops_for(X)
        w, rho, q = loops.key_forward(X, h, beta, v, k_eps ** 2)
        ctx.save_for_backward(X, h, beta, v, rho, q, w, A)
        ctx.set_materialize_grads(False)                             # an unused output's gradient is None
        return w, X.new_zeros(()).expand(X.shape), x_in + loops.rank_one_forward(w, h, A)

    @staticmethod
    def backward(ctx, g_w, G_mid, g_read):
        *saved, w, A = ctx.saved_tensors
        if g_read is None:
            return *_update_backward(ctx.loops, G_mid, g_w, *saved), None, None, None
        g_w_read, g_h_read, g_A = ctx.loops.rank_one_backward(g_read, w, saved[1], A)
        g_X, g_h, g_beta, g_v = _update_backward(ctx.loops, G_mid, g_w_read if g_w is None else g_w + g_w_read, *saved)
        return g_X, g_h + g_h_read, g_beta, g_v, g_read, g_A, None


class DeltaWrite(torch.autograd.Function):
    """A block's second update and the next read, d_v > 1: (H, X, k~_a, w_a, k~, beta, v, A, k_eps, store_state) ->
    (X_out, w, x_next), with X_mid = X + w_a k~_a^T (rebuilt from its factors, never stored), X_out = X_mid + w k~^T
    (delta_update of X_mid; empty unless store_state) and x_next = state_read(X_out, A) (A: the next block's taps or
    the final readout's). H is DeltaKey's handle of X_mid: its gradient is dL/dX_mid; X, k~_a and w_a only rebuild
    X_mid and get no gradient here. Backward reads dL/dX_out and X and writes dL/dX_mid: nothing
    state-sized is saved but X."""

    @staticmethod
    def forward(ctx, handle, X, h_a, w_a, h, beta, v, A, k_eps: float, store_state: bool):
        ctx.loops = loops_for(X)
        X_out, w, rho, q, x_next = ctx.loops.write_forward(X, h_a, w_a, h, beta, v, A, k_eps ** 2, store_state)
        ctx.save_for_backward(X, h_a, w_a, h, beta, v, rho, q, A)   # write_backward's order
        ctx.set_materialize_grads(False)                             # an unused output's gradient is None
        return cast(X_out, X.dtype), w, x_next

    @staticmethod
    def backward(ctx, G, g_w, g_next):
        X, *_ = saved = ctx.saved_tensors
        loops = ctx.loops
        G = None if G is not None and G.numel() == 0 else G          # the unstored state's (compiled: zeros)
        if g_next is None:
            g_next = X.new_zeros(X.shape[:2] + X.shape[3:], dtype=at_least_fp32(X.dtype))
        G_mid, g_h, g_beta, g_v, g_A = loops.write_backward(G, g_w, g_next, *saved)
        return G_mid, None, None, None, g_h, g_beta, g_v, g_A, None, None


class FusedDeltaSteps(torch.autograd.Function):
    """The S >= 2 Delta updates of a DeltaProduct sublayer in one pass over the state, X_s = X_{s-1} + w_s k~_s^T
    (each delta_update): (X, k_eps, k~_1, beta_1, v_1, ..., k~_S, beta_S, v_S) -> (X_S, w (B,T,S,dv)), in at
    least fp32 whatever autocast says. The intermediate states are never stored: backward recomputes them
    from X, rho and q (B,T,S,dv) and runs FusedDeltaUpdate's backward step by step in reverse."""

    @staticmethod
    def forward(ctx, X, k_eps: float, *steps):
        ctx.loops = loops_for(X)
        X_new, w, rho, q = ctx.loops.update_steps_forward(X, *_by_kind(steps), k_eps ** 2)
        ctx.save_for_backward(X, *steps, rho, q)
        return cast(X_new, X.dtype), w

    @staticmethod
    def backward(ctx, G, g_w):
        X, *inputs, rho, q = ctx.saved_tensors
        loops = ctx.loops
        g_X, g_h, g_beta, g_v = loops.update_steps_backward(G, g_w, X, *_by_kind(inputs), rho, q)
        return g_X, None, *(g for s in range(g_h.size(2)) for g in (g_h[:, :, s], g_beta[:, :, s, None], g_v[:, :, s]))


def _by_kind(steps: list) -> tuple[list, list, list]:
    """(k~_1, beta_1, v_1, k~_2, ...) -> ([k~_s], [beta_s], [v_s])."""
    return steps[0::3], steps[1::3], steps[2::3]


def _cpp_autograd(t: torch.Tensor) -> bool:
    """Whether an op on t runs as a C++ op with its autograd in C++ (cpu.cpp's update, key, write, norm): eagerly on CPU
    where the C++ loops run; torch.compile traces the Python Functions."""
    return loops_for(t) is torch.ops.ddl_delta and not _emulating_cuda and not torch.compiler.is_compiling()


def fused_update(X, h, beta, v, k_eps: float):
    """FusedDeltaUpdate: (X, k~, beta, v) -> (X + w k~^T, w), as the C++ autograd op where it runs."""
    if _cpp_autograd(X):
        return torch.ops.ddl_delta.update(X, h, beta, v, k_eps ** 2)
    return FusedDeltaUpdate.apply(X, h, beta, v, k_eps)


def fused_key(X, h, beta, v, x_in, A, k_eps: float):
    """DeltaKey, as the C++ autograd op where it runs."""
    if _cpp_autograd(X):
        return torch.ops.ddl_delta.key(X, h, beta, v, x_in, A, k_eps ** 2)
    return DeltaKey.apply(X, h, beta, v, x_in, A, k_eps)


def fused_write(handle, X, h_a, w_a, h, beta, v, A, k_eps: float, store_state: bool):
    """DeltaWrite, as the C++ autograd op where it runs."""
    if _cpp_autograd(X):
        return torch.ops.ddl_delta.write(handle, X, h_a, w_a, h, beta, v, A, k_eps ** 2, store_state)
    return DeltaWrite.apply(handle, X, h_a, w_a, h, beta, v, A, k_eps, store_state)


def update_steps(X, steps, k_eps: float):
    """A sublayer's Delta updates [(k~_s, beta_s, v_s)] in turn -> (X_S, [w_s]) (see delta.delta_update_steps):
    one update is fused_update, more are FusedDeltaSteps, one pass over the state for all of them."""
    if len(steps) == 1:
        X, w = fused_update(X, *steps[0], k_eps)
        return X, [w]
    X, w = FusedDeltaSteps.apply(X, k_eps, *(t for step in steps for t in step))
    return X, list(w.unbind(2))


def _keeping_inputs(name: str, op: str, doc: str) -> type[torch.autograd.Function]:
    """An autograd Function that saves its inputs and runs the loops' <op>_forward(*inputs), then
    <op>_backward(g, *inputs): what the three ops that need nothing else for backward share. Their outputs are in the
    computing dtype (at least fp32, whatever the inputs')."""
    def forward(ctx, *inputs):
        ctx.loops = loops_for(inputs[0])
        ctx.save_for_backward(*inputs)
        return getattr(ctx.loops, f"{op}_forward")(*inputs)

    def backward(ctx, g):
        return getattr(ctx.loops, f"{op}_backward")(g, *ctx.saved_tensors)

    return type(name, (torch.autograd.Function,),
                {"__doc__": doc, "forward": staticmethod(forward), "backward": staticmethod(backward)})


FusedStateRead = _keeping_inputs("FusedStateRead", "read", "state_read: X (B,T,dv,d), A (dv,d,L) -> (B,T,d).")
FusedRankOneRead = _keeping_inputs("FusedRankOneRead", "rank_one",
                                   "rank_one_read: w (B,T,dv), k~ (B,T,d), A (dv,d,L) -> (B,T,d).")
FusedExpand = _keeping_inputs("FusedExpand", "expand",
                              "expand_state: x (B,T,d), E (dv,d,L) -> the EC state (B,T,dv,d).")

MAX_FOLDED_MAPS = 32   # gate and value maps folded into the norm's row kernel on CUDA; a wider map is a matmul


def norm_projections(x, weight, W_c, W_x, eps: float, b_c=None, b_x=None, s_c: float = 1.0, s_x: float = 1.0):
    """(c, y_c, y_x) with c = rms_norm(x) * weight and the gates that read the norm's output and its input,
    y_c = gate(c W_c^T, b_c, s_c), y_x = gate(x W_x^T, b_x, s_x) (eager.gate: s sigmoid(. + b), or the map itself
    without biases): a sublayer's RMSNorm, gate maps and activations in one op where the loops have one (C++ on CPU,
    Triton on CUDA; its backward adds the gates' gradients into the norm's instead of writing and summing separate
    ones), else the plain ops. On CUDA a map of c wider than MAX_FOLDED_MAPS (the MLP gate's) runs as a matmul."""
    if _cpp_autograd(x):
        return torch.ops.ddl_delta.norm(x, weight, W_c, W_x, b_c, b_x, s_c, s_x, eps)
    loops = loops_for(x)
    if loops is eager:
        return eager.norm_projections(x, weight, W_c, W_x, eps, b_c, b_x, s_c, s_x)
    if loops is _TRITON and W_c.size(0) > MAX_FOLDED_MAPS:
        c, _, y_x = FusedNormProjections.apply(x, weight, W_c[:0], W_x, None, b_x, 1.0, s_x, eps)
        return c, eager.gate(torch.nn.functional.linear(c, W_c), b_c, s_c), y_x
    return FusedNormProjections.apply(x, weight, W_c, W_x, b_c, b_x, s_c, s_x, eps)


class FusedNormProjections(torch.autograd.Function):
    """norm_projections in one op each way, in at least fp32: c in autocast's dtype where it is on (what the
    sublayer's matmuls read), else in x's; the gates' outputs in the computing dtype. The C++ and Triton ops ignore
    autocast. Keeps x, rho = 1/sqrt(mean(x^2) + eps) and the gates' outputs (their activations' slopes) for
    backward."""

    @staticmethod
    def forward(ctx, x, weight, W_c, W_x, b_c, b_x, s_c: float, s_x: float, eps: float):
        device = x.device.type
        c_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        ctx.loops = loops = loops_for(x)
        if loops is _TRITON:
            c, y_c, y_x, rho = loops.norm_forward(x, weight, W_c, W_x, b_c, b_x, s_c, s_x, eps, c_dtype)
        else:
            c, y_c, y_x, rho = loops.norm_forward(x, weight, W_c, W_x, b_c, b_x, s_c, s_x, eps)
        ctx.save_for_backward(x, weight, W_c, W_x, b_c, b_x, rho, y_c, y_x)
        ctx.scales = s_c, s_x
        return cast(c, c_dtype), y_c, y_x

    @staticmethod
    def backward(ctx, g_c, g_yc, g_yx):
        x, weight, W_c, W_x, b_c, b_x, rho, y_c, y_x = ctx.saved_tensors
        loops = ctx.loops
        grads = [t.new_zeros(t.shape) if g is None else g for g, t in ((g_c, x), (g_yc, y_c), (g_yx, y_x))]
        *grads, g_bc, g_bx = loops.norm_backward(*grads, x, weight, W_c, W_x, b_c, b_x, *ctx.scales, rho, y_c, y_x)
        return *grads, None if b_c is None else g_bc, None if b_x is None else g_bx, None, None, None
