"""µP (Yang et al. 2022, Tensor Programs V, table 8 for Adam) for ModelConfig.param='mup', and CompleteP's
depth rules (Dey et al. 2025) for ModelConfig.depth_param='completep'.

The width multiplier is m = d_model / mup_base_width; at m = 1 µP is the standard form (sp) bit for bit.
Every parameter has a role (`role`, the table in docs/DESIGN.md says why each):

    role     what it is                                   init std            Adam lr    weight decay
    hidden   both fans grow with d (d x d, d x 8/3 d)     sp's (~1/sqrt(d))   lr / m     wd * m
    output   fan-in grows, fan-out fixed (d -> 1, d_v)    sp's / sqrt(m)      lr / m     wd * m
    input    fan-in fixed, fan-out grows (the embedding)  sp's (constant)     lr         wd
    vector   no fan-in that grows (gains, biases, taps)   its base width's    lr         wd

Weight decay times m keeps AdamW's per-step decay lr * wd the same at every width (as the mup
package's MuAdam does by default). The embedding is tied to the readout: it keeps its input role
and the logits are multiplied by 1/m instead (the mup package's MuSharedReadout). Attention keeps
1/sqrt(d_head): every size ddl defines grows its heads in number at a fixed size, where µP's
1/d_head rule is that constant. The Delta value v = s sigmoid(.) is multiplied by sqrt(m): the key k
has unit norm, so its coordinates are 1/sqrt(d), and the write beta k v^T (and with it the state X
and its readout) would otherwise shrink as 1/sqrt(m) against the embedding it is added to (the
coordinate check, `python -m ddl.coord`, measured it; the erase term beta k k^T X is a projection,
the same at every width). The init factors assume model.init=reference (matrices N(0,
0.5/sqrt(d))): the config refuses mup with another init. Each factor is m to a power (EXPONENTS); the
coordinate check's --skew moves one power to show that the check sees the error (`skewed`). The weight decay
of a matrix whose lr is scaled is divided by the same factor, so that lr * wd stays the base width's.

Two base-width constants µP leaves free, set in both parameterizations: the logits' multiplier
(ModelConfig.logit_mult, times 1/m under mup) and the embedding's lr factor (embed_lr_mult).

Depth (depth_param='completep', alpha = 1; the multiplier r = depth_base / n_layer): the baseline's residual
branches x + r F(norm x); DDL's write, X + beta k (r v - k^T X)^T, scaling the value and never beta (a
scaled beta would keep each layer's eigenvalue along k near 1: no projection, no reflection); Adam's eps
of every parameter in the blocks times r (their gradients shrink with r); the output projections' init at
depth_base's, not n_layer's. The hidden lr's factor r^(alpha - 1) is 1 at alpha = 1.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from .config import ModelConfig

HIDDEN, OUTPUT, INPUT, VECTOR = "hidden", "output", "input", "vector"
# (name suffix, role): the Linear maps by what they read and write
HIDDEN_MAPS = ("attn.qkv.weight", "attn.proj.weight", "mlp.w_gate.weight", "mlp.w_up.weight", "mlp.w_down.weight",
               "phi_k.weight", "W_k.weight")                               # v-Map's key map; DeltaProduct's W_k^j
OUTPUT_MAPS = ("beta_gate.weight", "beta_gate.0.weight",                   # the gate's d -> 1 (or d -> hidden)
               "W_v.weight")                                              # the value map, d -> d_v
STATE_MAPS = ("compress.weight", "readout.weight", "expand.weight")        # per-feature taps: fan-in d_v K
# µP's factors as powers of m: what each multiplies (the table in the module docstring)
EXPONENTS = {"output_init": -0.5, "vector_init": 0.5, "hidden_lr": -1.0, "output_lr": -1.0, "logits": -1.0,
             "value": 0.5}
_skew: dict[str, float] = {}             # factor -> power added to its exponent (skewed: the coordinate check's)
ADAM_EPS = 1e-8                          # torch's AdamW default, the base eps CompleteP scales


def width_multiplier(cfg: ModelConfig) -> float:
    return cfg.d_model / cfg.mup_base_width if cfg.param == "mup" else 1.0


def factor(name: str, m: float) -> float:
    """µP's factor `name` (EXPONENTS) at width multiplier m (1 / m as a division: pow may differ in the last bit)."""
    power = EXPONENTS[name] + _skew.get(name, 0.0)
    return 1.0 / m if power == -1.0 else m ** power


@contextlib.contextmanager
def skewed(name: str, power: float):
    """Models and optimizer groups built inside take µP's factor `name` times m**power: the coordinate
    check's proof that it would see such an error (`python -m ddl.coord --skew`)."""
    if name not in EXPONENTS:
        raise ValueError(f"--skew={name}: must be one of {', '.join(EXPONENTS)}")
    _skew[name] = power
    try:
        yield
    finally:
        del _skew[name]


def depth_multiplier(cfg: ModelConfig) -> float:
    """CompleteP's r = depth_base / n_layer (alpha = 1): a residual branch's or a Delta write's factor; 1 under
    depth_param='none'."""
    return cfg.depth_base / cfg.n_layer if cfg.depth_param == "completep" else 1.0


def init_depth(cfg: ModelConfig) -> int:
    """The depth the output projections' init is scaled for: n_layer, or CompleteP's depth_base (its branch
    multiplier does the rest)."""
    return cfg.depth_base if cfg.depth_param == "completep" else cfg.n_layer


def role(name: str, p: torch.Tensor) -> str:
    """The µP role of the parameter `name` (as GPT.named_parameters() names it)."""
    if name == "wte.weight":
        return INPUT
    if name.endswith(HIDDEN_MAPS):
        return HIDDEN
    if name.endswith(OUTPUT_MAPS):
        return OUTPUT
    if p.dim() == 1 or name.endswith(STATE_MAPS) or name.endswith("beta_gate.2.weight"):   # MLP gate's hidden -> 1
        return VECTOR
    raise ValueError(f"no µP role for parameter {name!r} {tuple(p.shape)}: add it to ddl/model/mup.py")


def _init_scales_with_width(name: str, p: torch.Tensor) -> bool:
    """Whether the reference init gave this vector-like parameter a std of 1/sqrt(d): the taps that
    start random and the value map's bias (PyTorch's U(+-1/sqrt(d)))."""
    return (p.dim() >= 2 and not name.endswith("expand.weight")) or name.endswith("W_v.bias")


def init_factor(name: str, p: torch.Tensor, m: float) -> float:
    """What µP multiplies the reference init of `name` by, at width multiplier m."""
    kind = role(name, p)
    if kind == OUTPUT:
        return factor("output_init", m)
    if kind == VECTOR and _init_scales_with_width(name, p):
        return factor("vector_init", m)
    return 1.0


@torch.no_grad()
def rescale_init(model: nn.Module, cfg: ModelConfig) -> None:
    m = width_multiplier(cfg)
    for name, p in model.named_parameters():
        factor = init_factor(name, p, m)
        if factor != 1.0:
            p.mul_(factor)


def lr_factor(name: str, p: torch.Tensor, cfg: ModelConfig) -> float:
    """What the parameter `name`'s Adam lr is multiplied by: µP's 1/m for hidden and output matrices, the
    embedding's embed_lr_mult."""
    kind, m = role(name, p), width_multiplier(cfg)
    if kind in (HIDDEN, OUTPUT):
        return factor("hidden_lr" if kind == HIDDEN else "output_lr", m)
    return cfg.embed_lr_mult if kind == INPUT else 1.0


def optimizer_groups(model: nn.Module, cfg: ModelConfig, lr: float, weight_decay: float) -> list[dict]:
    """AdamW's parameter groups: weight decay on matrices (linear weights, the tied embedding, conv
    kernels) only, never on gains, biases or read vectors; each at lr times lr_factor, with weight decay
    over it (lr * wd kept); under CompleteP the blocks' parameters with eps times depth_multiplier."""
    depth = depth_multiplier(cfg)
    groups: dict[tuple[bool, float, float], list] = {}
    for name, p in model.named_parameters():
        eps_scale = depth if name.startswith("blocks.") else 1.0
        groups.setdefault((p.dim() >= 2, lr_factor(name, p, cfg), eps_scale), []).append(p)
    return [{"params": params, "lr": lr * scale, "weight_decay": weight_decay / scale if decay else 0.0,
             **({"eps": ADAM_EPS * eps_scale} if eps_scale != 1.0 else {})}
            for (decay, scale, eps_scale), params in sorted(groups.items(),
                                                            key=lambda kv: (not kv[0][0], -kv[0][1], -kv[0][2]))]


def logit_multiplier(cfg: ModelConfig) -> float:
    return cfg.logit_mult * factor("logits", width_multiplier(cfg))


def value_multiplier(cfg: ModelConfig) -> float:
    """What the Delta value's scale s (v = s sigmoid(.)) is multiplied by: sqrt(m), so that the write
    beta k v^T of a unit key k keeps its base width's coordinates (the module docstring says why), times
    CompleteP's depth multiplier."""
    return factor("value", width_multiplier(cfg)) * depth_multiplier(cfg)
