"""GPT backbone shared by both arms; only the residual rule differs (paper section 4).

Pre-norm RMSNorm, causal multi-head attention with RoPE and QK-RMSNorm, SwiGLU MLP with
hidden floor(8/3 d), no biases, tied embedding / LM head, final RMSNorm. By default the
reference code's choices (ModelConfig: init, norm_eps, qk_norm, cc_padding).
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from . import torch_private
from .config import ModelConfig
from .delta import DeltaResidual, EmbedExpander, StateCompressor, delta_kernels, make_compressor
from .fused import at_least_fp32, state_dtype
from .mup import depth_multiplier, init_depth, logit_multiplier, rescale_init

OUTPUT_PROJECTIONS = ("attn.proj.weight", "mlp.w_down.weight")


def rope_tables(head_dim: int, max_seq_len: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (T, Dh/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B,H,T,Dh): rotate each (first half, second half) pair by its position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm with its weight in the input's dtype: under bf16 autocast the projections hand it
    bf16 activations, and with an fp32 weight torch falls back from its fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        self.norm_after_rope = cfg.qk_norm == "after_rope"

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).transpose(1, 3).unbind(2)  # (B,H,T,Dh)
        if self.norm_after_rope:
            q, k = self.q_norm(apply_rope(q, cos, sin)), self.k_norm(apply_rope(k, cos, sin))
        else:
            q, k = apply_rope(self.q_norm(q), cos, sin), apply_rope(self.k_norm(k), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, d))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = math.floor(8 / 3 * cfg.d_model)
        self.w_gate = nn.Linear(cfg.d_model, hidden, bias=False)
        self.w_up = nn.Linear(cfg.d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class AdditiveBlock(nn.Module):
    """Baseline: x <- x + r F(norm(x)) for attention, then for the MLP; r = 1 but under CompleteP
    (ModelConfig.depth_param, ddl/model/mup.py)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm_attn, self.attn = RMSNorm(cfg.d_model, eps=cfg.norm_eps), CausalSelfAttention(cfg)
        self.norm_mlp, self.mlp = RMSNorm(cfg.d_model, eps=cfg.norm_eps), SwiGLU(cfg)
        self.branch_scale = depth_multiplier(cfg)

    def branch(self, out: torch.Tensor) -> torch.Tensor:
        return out if self.branch_scale == 1.0 else out * self.branch_scale

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.branch(self.attn(self.norm_attn(x), cos, sin))
        return x + self.branch(self.mlp(self.norm_mlp(x)))


class DeltaBlock(nn.Module):
    """DDL: per sublayer compress -> process -> expand (section 4.2). The state X is (B,T,dv,d).

    For d_v = 1 the compressor is the identity (x_in = x, Eq. 3.1); for d_v > 1 one
    compressor per block serves both sublayers, as in the reference implementation, so the
    MLP's read is the attention's read plus the read of the attention's rank-1 write. The block
    also reads its new state for the next block (or the final readout): x_next.

    With d_v > 1 and one update a sublayer, the two updates are DeltaKey and DeltaWrite: the mid-block
    state X + w_a k~_a^T is never stored, and the next read is part of the second update.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.compress = make_compressor(cfg) if cfg.expanded else None
        self.norm_attn, self.attn = RMSNorm(cfg.d_model, eps=cfg.norm_eps), CausalSelfAttention(cfg)
        self.norm_mlp, self.mlp = RMSNorm(cfg.d_model, eps=cfg.norm_eps), SwiGLU(cfg)
        self.delta_attn, self.delta_mlp = DeltaResidual(cfg), DeltaResidual(cfg)
        self.ops = delta_kernels(cfg.kernels)
        self.two_updates = cfg.expanded and cfg.n_h == 1

    def forward(self, X: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, x_in: torch.Tensor | None = None,
                taps: torch.Tensor | None = None, reader: StateCompressor | None = None, store_state: bool = True):
        """(X_out, x_next, next_taps). x_in: the read of X by this block's compressor, taps: its taps (d_v > 1; each
        computed here when None; both None at d_v = 1, where X is its own read). next_taps: the reader's taps,
        x_next = reader(X_out): the next block's read or the final readout (both None at d_v = 1). X_out is empty when
        not store_state (d_v > 1, n_h = 1: the last block, whose state only the readout reads)."""
        if self.compress is None:
            x_in = X.squeeze(-2)
        else:
            taps = self.compress.taps() if taps is None else taps
            x_in = self.compress(X, taps) if x_in is None else x_in
        next_taps = None if reader is None else reader.taps()
        inp = self.delta_attn.read_input(x_in, self.norm_attn)
        h = self.attn(inp.c, cos, sin)
        if self.two_updates:
            (k_a, beta_a, v_a), = self.delta_attn.steps(h, inp)
            w_a, X_mid, x_mid = self.ops.key(X, k_a, beta_a, v_a, x_in, taps, self.delta_attn.k_eps)
            inp = self.delta_mlp.read_input(x_mid, self.norm_mlp)
            (k, beta, v), = self.delta_mlp.steps(self.mlp(inp.c), inp)
            X_out, _, x_next = self.ops.write(X_mid, X, k_a, w_a, k, beta, v, next_taps, self.delta_mlp.k_eps,
                                              store_state)
            return X_out, x_next, next_taps
        X, writes = self.delta_attn.update(X, h, inp)
        if self.compress is None:
            x_in = X.squeeze(-2)
        else:                                  # read(X + sum_j w_j k~_j^T), without another pass over X
            for w, k_raw in writes:
                x_in = x_in + self.compress.read_write(w, k_raw, taps)
        inp = self.delta_mlp.read_input(x_in, self.norm_mlp)
        X = self.delta_mlp.update(X, self.mlp(inp.c), inp)[0]
        return X, None if reader is None else reader(X, next_taps), next_taps


def effective_rank(X: torch.Tensor) -> torch.Tensor:
    """exp(entropy of the normalised singular values) of each d x d_v state: X (..., dv, d) -> (...),
    in [1, d_v] (1: a rank-1 state, d_v: d_v equal singular values)."""
    s = torch.linalg.svdvals(X.to(at_least_fp32(X.dtype)))
    p = s / s.sum(-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    return torch.special.entr(p).sum(-1).exp()


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        block = DeltaBlock if cfg.residual == "ddl" else AdditiveBlock
        self.blocks = nn.ModuleList(block(cfg) for _ in range(cfg.n_layer))
        self.expand = EmbedExpander(cfg) if cfg.expanded and cfg.embed_conv else None
        self.readout = make_compressor(cfg) if cfg.expanded else None   # final readout before norm_f
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.logit_multiplier = logit_multiplier(cfg)   # µP's readout: the tied embedding's logits / m
        self.kept: list | None = None                   # each block's state, while state_ranks() asks for them
        self.checkpoint_blocks = False                  # recompute each block's activations in backward
        self._init_weights()

    def _init_weights(self) -> None:
        """ModelConfig.init: 'reference' or 'gpt2' (its docstring says what each sets); then µP's factors
        (ddl/model/mup.py) under param='mup'."""
        if self.cfg.init == "reference":
            self._init_reference()
        else:
            self._init_gpt2()
        for _, delta in self.delta_residuals():  # after the generic pass, which may zero biases
            for gate_out in delta.gate_outputs():
                nn.init.constant_(gate_out.bias, delta.beta_bias_init)   # beta_j = beta_init at init
        if self.cfg.param == "mup":
            rescale_init(self, self.cfg)

    def _init_reference(self) -> None:
        """Every matrix and conv kernel N(0, 0.5/sqrt(d)), the output projections N(0, 0.5/sqrt(d L)) (L: CompleteP's
        depth_base), the embedding N(0, init_std); vectors (norms, biases, w_p) keep their construction values."""
        hidden_std = 0.5 / math.sqrt(self.cfg.d_model)
        for name, p in self.named_parameters():
            if p.dim() < 2 or (self.expand is not None and p is self.expand.weight):   # EC stays the identity
                continue
            if name == "wte.weight":
                std = self.cfg.init_std
            elif name.endswith(OUTPUT_PROJECTIONS):
                std = hidden_std / math.sqrt(init_depth(self.cfg))
            else:
                std = hidden_std
            self._normal_(name, p, std)

    def _init_gpt2(self) -> None:
        std = self.cfg.init_std
        residual_out_std = std / math.sqrt(2 * init_depth(self.cfg))
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                is_out = f"{name}.weight".endswith(OUTPUT_PROJECTIONS)
                self._normal_(f"{name}.weight", module.weight, residual_out_std if is_out else std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def _normal_(self, name: str, p: torch.Tensor, std: float) -> None:
        """N(0, std) into p: from torch's global stream in parameter order (init_streams=sequential), or from a
        stream of p's own, seeded by the seed torch was given and p's name (per_parameter)."""
        if self.cfg.init_streams == "sequential":
            nn.init.normal_(p, 0.0, std)
            return
        digest = hashlib.sha256(f"{torch.initial_seed()}:{name}".encode()).digest()
        stream = torch.Generator(device=p.device).manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        nn.init.normal_(p, 0.0, std, generator=stream)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.wte(idx)                                                      # (B,T,d)
        if self.cfg.residual == "ddl":
            X, x_in, taps = self.initial_state(x)
            readers = [block.compress for block in self.blocks[1:]] + [self.readout]
            for i, (block, reader) in enumerate(zip(self.blocks, readers, strict=True)):
                store = i + 1 < len(self.blocks) or self.kept is not None
                X, x_in, taps = self.run_block(block, X, cos, sin, x_in, taps, reader, store_state=store)
                if self.kept is not None:
                    self.kept.append(X)
            x = X.squeeze(-2) if self.readout is None else x_in                  # (B,T,d)
        else:
            for block in self.blocks:
                x = self.run_block(block, x, cos, sin)
        return self.head(x, targets)

    def run_block(self, block: nn.Module, *args, **kwargs):
        """block(*args, **kwargs), its activations recomputed in backward under checkpoint_blocks (what
        train.activation_checkpointing sets: memory for time, the same numbers)."""
        if self.checkpoint_blocks and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False, **kwargs)
        return block(*args, **kwargs)

    def initial_state(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """X0 (B,T,dv,d) in the state's dtype from the embedding x (B,T,d), and block 0's read of it from x with the
        taps it read with (d_v > 1; no pass over X0): the embedding repeated over d_v (a zero-strided view, a rank-1
        write), or EC's expansion."""
        B, T, d = x.shape
        dtype = state_dtype(self.cfg.state_dtype, x)
        if not self.cfg.expanded:
            return x.to(dtype).unsqueeze(-2), None, None                         # X0 = x_emb
        taps = self.blocks[0].compress.taps()
        if self.expand is not None:
            return self.expand(x).to(dtype), self.expand.read_expanded(x, taps), taps
        X = x.to(dtype).unsqueeze(-2).expand(B, T, self.cfg.dv, d)                # X0 = x_emb 1^T
        return X, self.blocks[0].compress.read_write(x.new_ones(B, T, self.cfg.dv), x, taps), taps

    def head(self, x: torch.Tensor, targets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The final norm, the logits (B,T,V) in at least fp32, and the loss when targets are given."""
        logits = self.lm_head(self.norm_f(x))
        logits = logits.to(at_least_fp32(logits.dtype))
        if self.logit_multiplier != 1.0:
            logits = logits * self.logit_multiplier
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def compile_blocks(self, backend: str = "inductor", mode: str | None = None) -> None:
        """torch.compile each block and the head in place, rather than the whole model: the blocks are the
        same code on parameters of the same shapes, so they share one compiled graph (block 0 of a DDL
        model, which also takes the embedding's read, a second), and compiling takes seconds, not minutes.
        mode: torch.compile's ("reduce-overhead": CUDA graphs, a step's launches replayed at once)."""
        for block in self.blocks:
            block.compile(fullgraph=True, backend=backend, mode=mode)
        self.head = torch.compile(self.head, fullgraph=True, backend=backend, mode=mode)
        torch_private.raise_recompile_limit(64)   # a block's graphs: block 0, the middle, the last; each mode

    def delta_residuals(self) -> list[tuple[str, DeltaResidual]]:
        return [(f"L{i:02d}.{part}", getattr(block, f"delta_{part}"))
                for i, block in enumerate(self.blocks) if isinstance(block, DeltaBlock)
                for part in ("attn", "mlp")]

    @torch.no_grad()
    def beta_stats(self) -> dict[str, float]:
        """Per sublayer and Delta step, beta from the last forward: mean, std, fraction > 1 (a negative
        eigenvalue: a reflection past the projection). Step 1 is `beta/L00.attn/...`, step j >= 2
        `beta/L00.attn.j2/...`; `beta/mean` and `beta/frac_gt1` pool every step."""
        stats: dict[str, float] = {}
        betas = []
        for name, module in self.delta_residuals():
            for j, beta in enumerate(module.last_betas, start=1):
                beta = beta.flatten()
                betas.append(beta)
                key = name if j == 1 else f"{name}.j{j}"
                stats[f"beta/{key}/mean"] = beta.mean().item()
                stats[f"beta/{key}/std"] = beta.std().item() if beta.numel() > 1 else 0.0
                stats[f"beta/{key}/frac_gt1"] = (beta > 1).float().mean().item()
        if betas:
            every = torch.cat(betas)
            stats["beta/mean"] = every.mean().item()
            stats["beta/frac_gt1"] = (every > 1).float().mean().item()
        return stats

    @torch.no_grad()
    def state_ranks(self, idx: torch.Tensor) -> dict[str, float]:
        """`erank/L00`...: the effective rank of the state X (d x d_v) after each block, averaged over
        the tokens of `idx` (d_v > 1; empty otherwise). See effective_rank."""
        if not self.cfg.expanded:
            return {}
        self.kept = []                     # the forward keeps each block's state (no hooks: blocks may be compiled)
        try:
            self(idx)
            return {f"erank/L{i:02d}": effective_rank(X).mean().item() for i, X in enumerate(self.kept)}
        finally:
            self.kept = None

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # the tied embedding is counted once

