"""What one training step moves through memory, counted from its op stream without running it.

The step (forward, backward, fused AdamW) runs on fake tensors (FakeTensorMode: shapes and dtypes, no
data) under bf16 autocast, with the CUDA path's kernels and state dtype: each op a GPU would launch is
seen once by a dispatch mode, which adds up the bytes it reads and writes (its tensor inputs plus its
outputs), calls a view free, and sorts the rest into

- matmul: a matrix product whose every side is at least MATMUL_MIN_SIDE (compute-bound; a skinny
  product, a gate's d -> 1 map, is memory traffic like any elementwise op),
- attention: the fused attention kernels,
- the rest, `non_matmul_bytes`: the traffic that decides a memory-bound step's time.

Each fused custom op (the Delta kernels) is one op: its inputs and outputs, nothing of its inside.
RMSNorm runs as one fused op forward and one backward, as torch's fused CUDA kernels do. `saved_bytes`
is what autograd holds for backward at the end of the forward (unique storages, parameters excluded).

    step_traffic(cfg, batch=16, seq=1024) -> {"non_matmul_bytes", "saved_bytes", "kernel_calls", ...}
"""

from __future__ import annotations

import collections
import contextlib
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from .model.torch_private import FakeTensorMode, TorchDispatchMode, storage_key, tree_leaves
from .validation import OneLineParser

MATMUL_MIN_SIDE = 16
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "_addmm_activation", "matmul"}
FREE = {"_unsafe_view", "detach", "alias", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
        "new_empty_strided", "_local_scalar_dense", "device"}
WRITE_ONLY = {"new_zeros", "new_ones", "new_full", "zeros_like", "ones_like", "full_like", "zeros", "ones", "full",
              "fill", "zero_"}                               # they write their output and read no input


def _tensors(tree) -> list[torch.Tensor]:
    leaves = tree_leaves(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    """The bytes an op touches of t: every element once (a broadcast view: its storage's share)."""
    if 0 in t.stride() or not t.is_contiguous():
        distinct = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True) if size)
        return min(t.numel(), distinct) * t.element_size() if t.numel() else 0
    return t.numel() * t.element_size()


def _kind(func, inputs: list[torch.Tensor]) -> str:
    name = func.overloadpacket.__name__
    if name in MATMULS:
        mats = [t for t in inputs if t.dim() >= 2]
        sides = [s for t in mats for s in t.shape[-2:]]
        return "matmul" if sides and min(sides) >= MATMUL_MIN_SIDE else "memory"
    if "attention" in name or "scaled_dot_product" in name:
        return "attention"
    return "memory"


class OpCounter(TorchDispatchMode):
    """Adds up each op's bytes (inputs + outputs) by kind, and the calls that launch a kernel."""

    def __init__(self):
        super().__init__()
        self.bytes = collections.Counter()
        self.calls = collections.Counter()
        self.by_op = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view or name in FREE:
            return out
        inputs = [] if name in WRITE_ONLY else _tensors((args, kwargs))
        touched = sum(_nbytes(t) for t in inputs) + sum(_nbytes(t) for t in _tensors(out))
        kind = _kind(func, inputs)
        self.bytes[kind] += touched
        self.calls[kind] += 1
        self.by_op[f"{func.namespace}::{name}"] += touched
        return out


# RMSNorm as CUDA runs it: one fused kernel each way (on CPU torch decomposes it into five ops).
_norm_lib = torch.library.Library("ddl_traffic", "DEF")
_norm_lib.define("rms_norm(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)")
_norm_lib.define("rms_norm_backward(Tensor g, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)")


@torch.library.register_fake("ddl_traffic::rms_norm")
def _(x, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1] + (1,), dtype=torch.float32)


@torch.library.register_fake("ddl_traffic::rms_norm_backward")
def _(g, x, weight, rstd):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


class _FusedRMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = torch.ops.ddl_traffic.rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, g):
        g_x, g_w = torch.ops.ddl_traffic.rms_norm_backward(g, *ctx.saved_tensors)
        return g_x, g_w, None


class _FusedNorms(TorchFunctionMode):
    """F.rms_norm with a weight as _FusedRMSNorm (the weight cast to x's dtype, as GPT's RMSNorm does)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) == "rms_norm":
            named = dict(zip(("input", "normalized_shape", "weight", "eps")[:len(args)], args, strict=True), **kwargs)
            x, shape, weight, eps = (named.get(k) for k in ("input", "normalized_shape", "weight", "eps"))
            if weight is not None and len(shape) == 1:
                return _FusedRMSNorm.apply(x, weight, float(eps if eps is not None else 1e-6))
        return func(*args, **kwargs)


@contextlib.contextmanager
def _saved_storages(parameters: set[int], saved: dict[int, int]):
    def pack(t):
        storage = t.untyped_storage()
        if storage_key(storage) not in parameters:
            saved[storage_key(storage)] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def step_traffic(cfg, batch: int = 16, seq: int = 1024) -> dict:
    """One training step of GPT(cfg) on batch x seq tokens, on fake tensors, with the CUDA path's kernels and dtypes:
    non_matmul_bytes, matmul_bytes, attention_bytes, saved_bytes, kernel_calls, and the largest ops' bytes."""
    from .model import GPT
    from .model.fused import cuda_path

    with torch.device("meta"):
        model = GPT(cfg)
    counter, saved = OpCounter(), {}
    with FakeTensorMode(allow_non_fake_inputs=True), cuda_path():
        model = model.to_empty(device="cpu")
        parameters = {storage_key(p.untyped_storage()) for p in model.parameters()}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        idx = torch.zeros(batch, seq, dtype=torch.long)
        with counter:
            with _FusedNorms(), torch.autocast("cpu", dtype=torch.bfloat16), _saved_storages(parameters, saved):
                _, loss = model(idx, idx)
            with _FusedNorms():
                loss.backward()
            optimizer.step()
    biggest = dict(counter.by_op.most_common(12))
    return {"non_matmul_bytes": counter.bytes["memory"], "matmul_bytes": counter.bytes["matmul"],
            "attention_bytes": counter.bytes["attention"], "saved_bytes": sum(saved.values()),
            "kernel_calls": sum(counter.calls.values()), "tokens": batch * seq, "largest_ops": biggest}


# ---- the table the dry run prices jobs from (ddl/costs.py reads it without importing torch) ----

TABLE_SIZE = "small"
TABLE_ARMS = {                  # every arm the sweeps name, at d_v in 1, 2, 4, 8 and each variant at d_v = 4
    "baseline": {},
    **{f"ddl_dv{dv}": dict(residual="ddl", dv=dv) for dv in (1, 2, 4, 8)},
    **{f"ddl_dv4_{conv}": dict(residual="ddl", dv=4, conv=conv) for conv in ("cc", "ec", "cc_ec")},
    "ddl_dv1_vmap": dict(residual="ddl", dv=1, mapping="v"), "ddl_dv4_vmap": dict(residual="ddl", dv=4, mapping="v"),
    "ddl_dv4_mlp_gate": dict(residual="ddl", dv=4, beta_estimator="mlp"),
    "ddl_dv1_nh2": dict(residual="ddl", dv=1, n_h=2), "ddl_dv4_nh2": dict(residual="ddl", dv=4, n_h=2),
}


def coefficients() -> dict:
    """Per arm (arm_key): the step's extra non-matmul bytes and extra saved bytes over the baseline's, per token, layer
    and feature, at TABLE_SIZE; and the baseline's saved bytes per token, as saved_per_layer_feature * layers * d +
    saved_per_vocab * vocab (from the size and the same size at 2 layers)."""
    from .costs import arm_key
    from .model import SIZES, ModelConfig

    shape = {**SIZES[TABLE_SIZE], "vocab_size": ModelConfig.vocab_size}
    tokens, layer_features = 16 * 1024, shape["n_layer"] * shape["d_model"]
    counted = {name: step_traffic(ModelConfig(**shape, **arm)) for name, arm in TABLE_ARMS.items()}
    two_layers = step_traffic(ModelConfig(**{**shape, "n_layer": 2}))
    base = counted["baseline"]
    per_layer_feature = (base["saved_bytes"] - two_layers["saved_bytes"]) / tokens / ((shape["n_layer"] - 2)
                                                                                      * shape["d_model"])
    per_vocab = (base["saved_bytes"] / tokens - per_layer_feature * layer_features) / shape["vocab_size"]
    arms = {arm_key(ModelConfig(**shape, **TABLE_ARMS[name])): {
        "extra_bytes": (row["non_matmul_bytes"] - base["non_matmul_bytes"]) / tokens / layer_features,
        "extra_saved": (row["saved_bytes"] - base["saved_bytes"]) / tokens / layer_features}
        for name, row in counted.items()}
    return {"size": TABLE_SIZE, "torch": torch.__version__, "baseline_saved_per_layer_feature": per_layer_feature,
            "baseline_saved_per_vocab": per_vocab, "arms": arms}


def main(argv: list[str] | None = None) -> int:
    import json

    from . import paths
    parser = OneLineParser(prog="python -m ddl.traffic", description="Writes the table of each arm's memory "
                           "traffic per token, layer and feature that the dry run prices GPU jobs from.")
    from .costs import TRAFFIC_TABLE
    parser.add_argument("--out", type=Path, default=TRAFFIC_TABLE, help=f"default {TRAFFIC_TABLE}")
    args = parser.parse_args(argv)
    paths.write_atomic(args.out, json.dumps(coefficients(), indent=1, sort_keys=True) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
