"""The authors' checkpoints (GitHub yifanzhang-pro/deep-delta-learning, `model/`) as our GPT.

Their models name and lay out parameters differently; the functions are the same (tested against
float64 logits and gradients of their code, tests/fixtures/reference_parity.pt):
- separate c_q, c_k, c_v projections are our fused qkv (stacked along the output rows);
- the token-axis short conv's (d*d_v, K) weight is our (d*d_v, 1, K) depthwise kernel (channel
  i*d_v + j in both); the d_v-axis conv's (d, K) weight and the EC expander's conv are ours as is;
- the rest is renaming: transformer.h.<i>.ln_1 -> blocks.<i>.norm_attn, ddl_attn.beta -> delta_attn.beta_gate, ...
Their variants are ours with init=reference, norm_eps=1e-5, qk_norm=after_rope, cc_padding=centered
(the defaults); v-Map has no reference model.
"""

from __future__ import annotations

import re

import torch

from .config import ModelConfig

VARIANTS = {"baseline": dict(residual="baseline"), "ddl_dv1": dict(residual="ddl", dv=1),
            "ddl_dv4": dict(residual="ddl", dv=4), "ddl_dv4_ec": dict(residual="ddl", dv=4, conv="ec"),
            "ddl_dv4_cc": dict(residual="ddl", dv=4, conv="cc"),
            "ddl_dv4_cc_ec": dict(residual="ddl", dv=4, conv="cc_ec")}
WRAPPER_PREFIXES = ("module.", "_orig_mod.")           # DDP and torch.compile wrap the state dict's names
TIED = "lm_head.weight"                                # the reference's tied LM head: the embedding again

_BLOCK_NAMES = {"attn.proj.weight": "attn.c_proj.weight", "attn.q_norm.weight": "attn.q_rms.weight",
                "attn.k_norm.weight": "attn.k_rms.weight", "mlp.w_gate.weight": "mlp.c_fc1.weight",
                "mlp.w_up.weight": "mlp.c_fc2.weight", "mlp.w_down.weight": "mlp.c_proj.weight",
                "norm_attn.weight": "ln_1.weight", "norm_mlp.weight": "ln_2.weight"}
_DELTA_NAMES = {"beta_gate.weight": "beta.weight", "beta_gate.bias": "beta.bias",
                "beta_gate.0.weight": "beta_in.weight", "beta_gate.2.weight": "beta_out.weight",
                "beta_gate.2.bias": "beta_out.bias",
                "W_v.weight": "v_proj.weight", "W_v.bias": "v_proj.bias"}


class ReferenceMismatch(ValueError):
    """The state dict is not the variant's: names the first missing, mis-shaped or unexpected tensor."""


def variant_config(variant: str, state_dict: dict[str, torch.Tensor], max_seq_len: int) -> ModelConfig:
    """The variant's ModelConfig with the dimensions read off the state dict (embedding, layers, QK norm)."""
    if variant not in VARIANTS:
        raise ReferenceMismatch(f"variant={variant!r}: must be one of {', '.join(VARIANTS)}")
    state_dict = strip_wrappers(state_dict)
    for name in ("transformer.wte.weight", "transformer.h.0.attn.q_rms.weight"):
        if name not in state_dict:
            raise ReferenceMismatch(f"reference state dict: missing {name} (not a checkpoint of the authors' GPT)")
    vocab, d = state_dict["transformer.wte.weight"].shape
    head_dim = state_dict["transformer.h.0.attn.q_rms.weight"].numel()
    n_layer = 1 + max(int(m.group(1)) for key in state_dict if (m := re.match(r"transformer\.h\.(\d+)\.", key)))
    return ModelConfig(vocab_size=vocab, n_layer=n_layer, n_head=d // head_dim, d_model=d, max_seq_len=max_seq_len,
                       **VARIANTS[variant])


def strip_wrappers(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in state_dict.items():
        for prefix in WRAPPER_PREFIXES:
            key = key.removeprefix(prefix)
        out[key] = value
    return out


def reference_layout(ours: str, shape: torch.Size, cfg: ModelConfig) -> list[tuple[str, tuple[int, ...]]]:
    """The reference tensors (name, shape) that our parameter `ours` of `shape` is made of, in order."""
    if ours == "wte.weight":
        return [("transformer.wte.weight", tuple(shape))]
    if ours == "norm_f.weight":
        return [("ln_f.weight", tuple(shape))]
    if ours == "expand.weight":
        return [("input_embed.conv.weight", tuple(shape))]
    block = re.match(r"blocks\.(\d+)\.(.*)", ours)
    prefix, rest = (f"transformer.h.{block.group(1)}.", block.group(2)) if block else ("", ours)
    if rest == "attn.qkv.weight":
        return [(f"{prefix}attn.c_{part}.weight", (cfg.d_model, cfg.d_model)) for part in "qkv"]
    if rest in _BLOCK_NAMES:
        return [(prefix + _BLOCK_NAMES[rest], tuple(shape))]
    sublayer = re.match(r"delta_(attn|mlp)\.(.*)", rest)
    if sublayer and sublayer.group(2) in _DELTA_NAMES:
        return [(f"{prefix}ddl_{sublayer.group(1)}.{_DELTA_NAMES[sublayer.group(2)]}", tuple(shape))]
    compressor = re.match(r"(compress|readout)\.(weight|read)", rest)
    if compressor:
        module, kind = compressor.groups()
        if kind == "read" or cfg.channel_conv:
            return [(f"{prefix}{module}.{kind}", tuple(shape))]
        return [(f"{prefix}{module}.shortconv.weight", (shape[0], shape[-1]))]   # (d*dv, K): ours is (d*dv, 1, K)
    raise ReferenceMismatch(f"{ours}: no tensor of the reference models (mapping={cfg.mapping})")


def to_ours(tensors: dict[str, torch.Tensor], model: torch.nn.Module, strict: bool = True) -> dict[str, torch.Tensor]:
    """Reference-named tensors (a state dict, or its gradients) -> ours for `model` (a GPT).

    strict: every tensor the variant needs is there with its shape, and nothing else is (the
    tied LM head may be there, equal to the embedding). Else a ReferenceMismatch naming the first
    offender. Non-strict maps what is there (gradients of the tied head come with the embedding)."""
    tensors = strip_wrappers(tensors)
    out, used = {}, {TIED}
    for name, param in model.named_parameters():
        parts = reference_layout(name, param.shape, model.cfg)
        if not strict and not all(ref in tensors for ref, _ in parts):
            continue
        for ref, shape in parts:
            if ref not in tensors:
                raise ReferenceMismatch(f"reference state dict: missing {ref} (variant needs it for {name})")
            if tuple(tensors[ref].shape) != shape:
                raise ReferenceMismatch(f"reference state dict: {ref} has shape {tuple(tensors[ref].shape)}, "
                                        f"the variant needs {shape}")
            used.add(ref)
        out[name] = torch.cat([tensors[ref] for ref, _ in parts]).reshape(param.shape)
    extra = [name for name in tensors if name not in used]
    if strict and extra:
        raise ReferenceMismatch(f"reference state dict: unexpected tensor {extra[0]} {tuple(tensors[extra[0]].shape)} "
                                f"for this variant")
    if strict and TIED in tensors and not torch.equal(tensors[TIED], tensors["transformer.wte.weight"]):
        raise ReferenceMismatch(f"reference state dict: {TIED} differs from transformer.wte.weight (they are tied)")
    return out


def load_reference(state_dict: dict[str, torch.Tensor], variant: str, max_seq_len: int = 1024):
    """Our GPT (eval mode) computing what the reference variant computes with these weights."""
    from .gpt import GPT

    model = GPT(variant_config(variant, state_dict, max_seq_len))
    weights = to_ours(state_dict, model)
    model.load_state_dict({**weights, "lm_head.weight": weights["wte.weight"]})      # tied
    return model.eval()
