"""The implemented models: the paper's update, identities, causality, parameter counts, validation."""

import dataclasses

import pytest
import torch

from ddl.model import GPT, ddl_extra_params, model_config, param_count
from ddl.model.delta import ChannelConvCompressor, EmbedExpander

VOCAB = 64
VARIANTS = {
    "baseline": dict(residual="baseline"),
    "ddl_dv1_k": dict(residual="ddl"),
    "ddl_dv1_v": dict(residual="ddl", mapping="v"),
    "ddl_dv4": dict(residual="ddl", dv=4),
    "ddl_dv4_ec": dict(residual="ddl", dv=4, conv="ec"),
    "ddl_dv4_cc": dict(residual="ddl", dv=4, conv="cc"),
    "ddl_dv4_cc_ec": dict(residual="ddl", dv=4, conv="cc_ec"),
    "ddl_dv4_v_mlp": dict(residual="ddl", dv=4, mapping="v", beta_estimator="mlp", beta_hidden=8),
}


def micro(dtype=torch.float32, **kw):
    torch.manual_seed(0)
    return GPT(model_config("micro", vocab_size=VOCAB, **kw)).to(dtype)


def tokens(B=2, T=12, seed=0):
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dv", [1, 4])
@pytest.mark.parametrize("mapping", ["k", "v"])
def test_delta_sublayer_equals_float64_eq_2_4(dv, mapping):
    """Run one DDL sublayer and rebuild Eq. 2.4 from the module's own k, beta, v."""
    model = micro(torch.float64, residual="ddl", dv=dv, mapping=mapping)
    block, delta = model.blocks[0], model.blocks[0].delta_attn
    X = torch.randn(2, 5, dv, 64, dtype=torch.float64)                          # stored (B,T,dv,d)
    cos, sin = model.rope_cos[:5], model.rope_sin[:5]
    x_in = X.squeeze(-2) if block.compress is None else block.compress(X)
    inp = delta.read_input(x_in, block.norm_attn)
    assert torch.allclose(inp.c, block.norm_attn(x_in), atol=1e-12)
    h = block.attn(inp.c, cos, sin)
    out, [(w, k_written)] = delta.update(X, h, inp)                                    # n_h = 1: one write
    k_raw, beta, v = delta.components(h, inp, inp.gate, inp.v)             # n_h = 1: every gate is step 1's
    assert torch.allclose(beta, 2 * torch.sigmoid(delta.beta_gate(inp.c)), atol=1e-12)
    assert torch.allclose(v, 4 * torch.sigmoid(delta.W_v(x_in if mapping == "k" else h)), atol=1e-12)
    assert torch.equal(k_written, k_raw)
    assert torch.allclose(out, X + w.unsqueeze(-1) * k_raw.unsqueeze(-2), atol=1e-12)   # the rank-1 write
    k = k_raw / (k_raw.pow(2).sum(-1, keepdim=True) + delta.k_eps ** 2).sqrt()   # the unit key
    A = torch.eye(64, dtype=torch.float64) - beta[..., None] * k[..., :, None] * k[..., None, :]
    expected = A @ X.mT + beta[..., None] * k[..., :, None] * v[..., None, :]    # Eq. 2.4, X as d x dv
    assert torch.allclose(out.mT, expected, atol=1e-10)
    assert torch.allclose(k.norm(dim=-1), torch.ones(2, 5, dtype=torch.float64), atol=1e-6)


@pytest.mark.parametrize("T", [7, 2])
@pytest.mark.parametrize("name", ["ddl_dv4", "ddl_dv4_cc"])
def test_reading_a_rank_one_write_equals_reading_the_new_state(name, T):
    """What lets a block read its updated state without another pass over it."""
    compress = micro(torch.float64, **VARIANTS[name]).blocks[0].compress
    torch.nn.init.normal_(compress.read)
    g = torch.Generator().manual_seed(6)
    X = torch.randn(2, T, 4, 64, dtype=torch.float64, generator=g)
    w = torch.randn(2, T, 4, dtype=torch.float64, generator=g)
    k_raw = torch.randn(2, T, 64, dtype=torch.float64, generator=g)
    new = X + w.unsqueeze(-1) * k_raw.unsqueeze(-2)
    assert torch.allclose(compress(new), compress(X) + compress.read_write(w, k_raw), atol=1e-12)


@pytest.mark.parametrize("name", ["ddl_dv4", "ddl_dv4_ec", "ddl_dv4_cc_ec"])
def test_block_0_reads_the_initial_state_from_the_embedding(name):
    """GPT reads X0 from x (a rank-1 write, or two composed convs for EC) instead of from X0."""
    model = micro(torch.float64, **VARIANTS[name])
    compress = model.blocks[0].compress
    torch.nn.init.normal_(compress.read)
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    if model.expand is None:
        X0, from_x = x.unsqueeze(-2).expand(2, 9, 4, 64), compress.read_write(x.new_ones(2, 9, 4), x)
    else:
        torch.nn.init.normal_(model.expand.weight)
        X0, from_x = model.expand(x), model.expand.read_expanded(x, compress.taps())
    assert torch.allclose(from_x, compress(X0), atol=1e-12)


@pytest.mark.parametrize("name", ["ddl_dv1_k", "ddl_dv4", "ddl_dv4_cc_ec"])
def test_beta_to_zero_makes_each_sublayer_the_identity(name):
    model = micro(torch.float64, beta_init=0.0, **VARIANTS[name])
    for _, delta in model.delta_residuals():
        torch.nn.init.constant_(delta.beta_gate.bias, -1e4)   # the saturated limit beta -> 0
    X = torch.randn(2, 6, model.cfg.dv, 64, dtype=torch.float64)
    cos, sin = model.rope_cos[:6], model.rope_sin[:6]
    for block in model.blocks:
        X_out, x_next, _ = block(X, cos, sin, reader=block.compress)   # any reader: here the block's own
        assert torch.allclose(X_out, X, atol=1e-8)
        if block.compress is not None:
            assert torch.allclose(x_next, block.compress(X), atol=1e-8)


@pytest.mark.parametrize("name", VARIANTS)
def test_causality(name):
    model = micro(**VARIANTS[name]).eval()
    idx = tokens(T=16)
    t = 9
    changed = idx.clone()
    changed[:, t + 1:] = (changed[:, t + 1:] + 1) % VOCAB
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1])
    assert not torch.allclose(a[:, t + 1:], b[:, t + 1:])


def test_ec_at_init_repeats_the_embedding():
    cfg = model_config("micro", vocab_size=VOCAB, residual="ddl", dv=4, conv="ec")
    x = torch.randn(2, 7, 64)
    assert torch.equal(EmbedExpander(cfg)(x), x.unsqueeze(-2).expand(2, 7, 4, 64))


def test_cc_with_kernel_dv_is_a_per_feature_weighted_sum():
    cfg = model_config("micro", vocab_size=VOCAB, residual="ddl", dv=4, conv="cc")
    assert cfg.state_kernel == 4
    compress = ChannelConvCompressor(cfg).double()
    X = torch.randn(2, 3, 4, 64, dtype=torch.float64)
    out = compress(X)
    # the linear map per feature i: a[j, i] = response to a unit impulse in value channel j
    a = torch.stack([compress(torch.eye(4, dtype=torch.float64)[j, :, None].expand(1, 1, 4, 64))[0, 0]
                     for j in range(4)])                                           # (dv, d)
    assert torch.allclose(out, (X * a).sum(-2), atol=1e-12)


def assert_same_map_and_gradients(fused, eager, X, module):
    """The compressor (FusedStateRead) against its plain-PyTorch definition, values and gradients."""
    X = X.requires_grad_()
    out, expected = fused(X), eager(X)
    assert torch.allclose(out, expected, atol=1e-12)
    G = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(4))
    grads = torch.autograd.grad(out, [X, *module.parameters()], G)
    expected_grads = torch.autograd.grad(expected, [X, *module.parameters()], G)
    for a, b in zip(grads, expected_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("padding", ["centered", "causal"])
@pytest.mark.parametrize("kernel", [1, 2, 3, 4])
def test_cc_mixing_equals_conv_along_dv_then_read(kernel, padding):
    import torch.nn.functional as F
    cfg = model_config("micro", vocab_size=VOCAB, residual="ddl", dv=4, conv="cc", state_conv_kernel=kernel,
                       cc_padding=padding)
    compress = ChannelConvCompressor(cfg).double()
    torch.nn.init.normal_(compress.read)
    left = kernel - 1 if padding == "causal" else (kernel - 1) // 2

    def conv_along_dv_then_read(X):                                           # X: the paper's d x dv
        windows = F.pad(X, (left, kernel - 1 - left)).unfold(-1, kernel, 1)
        return torch.einsum("btdjk,dk->btdj", windows, compress.weight) @ compress.read

    X = torch.randn(2, 3, 4, 64, dtype=torch.float64)                            # stored (B,T,dv,d)
    assert_same_map_and_gradients(compress, lambda X: conv_along_dv_then_read(X.mT), X, compress)


@pytest.mark.parametrize("T", [9, 2])
def test_time_conv_compressor_equals_depthwise_conv_then_read(T):
    import torch.nn.functional as F
    from ddl.model.delta import TimeConvCompressor
    cfg = model_config("micro", vocab_size=VOCAB, residual="ddl", dv=4)
    compress = TimeConvCompressor(cfg).double()
    torch.nn.init.normal_(compress.read)

    def conv_then_read(X):                                                    # X: the paper's d x dv
        flat = F.pad(X.reshape(2, T, 256).transpose(1, 2), (3, 0))             # (B, d*dv, T+K-1)
        conv = F.conv1d(flat, compress.weight, groups=256).transpose(1, 2).reshape(2, T, 64, 4)
        return conv @ compress.read

    X = torch.randn(2, T, 4, 64, dtype=torch.float64)                            # stored (B,T,dv,d)
    assert_same_map_and_gradients(compress, lambda X: conv_then_read(X.mT), X, compress)


@pytest.mark.slow
def test_parameter_counts_match_the_paper():
    for size, paper in (("small", 124e6), ("medium", 353e6)):
        n_params = GPT(model_config(size)).num_params()
        assert abs(n_params / paper - 1) < 0.01 and n_params == param_count(model_config(size))


@pytest.mark.parametrize("name", VARIANTS)
def test_ddl_extra_params(name):
    cfg = model_config("micro", vocab_size=VOCAB, **VARIANTS[name])
    base = GPT(dataclasses.replace(cfg, residual="baseline")).num_params()
    assert GPT(cfg).num_params() - base == ddl_extra_params(cfg)
    assert GPT(cfg).num_params() == param_count(cfg)
    assert (ddl_extra_params(cfg) > 0) == (cfg.residual == "ddl")


@pytest.mark.parametrize("name", VARIANTS)
def test_gradients_reach_every_parameter_and_bf16_is_finite(name):
    model = micro(**VARIANTS[name])
    idx = tokens()
    _, loss = model(idx, tokens(seed=1))
    loss.backward()
    dead = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not dead
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, tokens(seed=1))
    assert torch.isfinite(logits).all() and torch.isfinite(loss)


def loss_and_grads(model):
    _, loss = model(tokens(), tokens(seed=1))
    loss.backward()
    return loss, {name: p.grad for name, p in model.named_parameters()}


def assert_same_numbers(a, b, atol=1e-6):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert torch.allclose(loss_a, loss_b, atol=atol)
    for name, grad in grads_a.items():
        assert torch.allclose(grad, grads_b[name], atol=atol, rtol=1e-4), name


@pytest.mark.slow
def test_compiled_kernels_give_the_fused_numbers():
    """kernels=compiled (torch.compile of the plain forms) against the hand-fused default."""
    fused, compiled = micro(**VARIANTS["ddl_dv4_cc_ec"]), micro(kernels="compiled", **VARIANTS["ddl_dv4_cc_ec"])
    compiled.load_state_dict(fused.state_dict())
    assert_same_numbers(loss_and_grads(fused), loss_and_grads(compiled))


@pytest.mark.parametrize("name, width", [("ddl_dv1_k", 64), ("ddl_dv4", 64), ("ddl_dv4", 44), ("ddl_dv4_ec", 64),
                                         ("ddl_dv4_cc", 64), ("ddl_dv4_v_mlp", 64)])
def test_the_fused_kernels_give_the_same_numbers_in_cpp_and_in_pytorch_ops(name, width, monkeypatch):
    """The fused ops' C++ loops (the CPU default) against their PyTorch-op twins (CUDA's), whole model; width 44 runs
    the C++ SIMD loops over whole vectors and a remainder at 16 or 8 floats a vector (64: whole vectors only)."""
    from ddl.model.fused import eager, loops_for, native as native_loops
    native = loss_and_grads(micro(d_model=width, **VARIANTS[name]))
    monkeypatch.setattr(native_loops, "ENABLED", False)
    assert loops_for(torch.zeros(1)) is eager
    assert_same_numbers(native, loss_and_grads(micro(d_model=width, **VARIANTS[name])))


@pytest.mark.parametrize("init, tolerance", [("gpt2", 0.05), ("reference", 0.15)])
def test_beta_stats_follow_beta_init(init, tolerance):
    """beta = 2 sigmoid(w.c + logit(beta_init/2)): the reference's w (std 0.5/sqrt(d)) spreads it more."""
    model = micro(residual="ddl", dv=4, beta_init=0.5, init=init)
    model(tokens())
    stats = model.beta_stats()
    assert abs(stats["beta/mean"] - 0.5) < tolerance
    assert stats["beta/frac_gt1"] < 0.05
    assert {"beta/L00.attn/mean", "beta/L01.mlp/std", "beta/L01.mlp/frac_gt1"} <= stats.keys()
    assert micro().beta_stats() == {}


def test_effective_config_drops_knobs_that_cannot_change_the_numbers():
    base = model_config("micro", residual="baseline")
    assert model_config("micro", residual="baseline", dv=4, conv="cc").effective() == base.effective()
    assert model_config("micro", residual="ddl", dv=1).effective() != base.effective()
    dv4 = model_config("micro", residual="ddl", dv=4)
    assert dv4.effective() == model_config("micro", residual="ddl", dv=4, state_conv_kernel=4,
                                           read_init=0.25, embed_conv_kernel=3).effective()
    assert model_config("micro", residual="ddl", dv=4, conv="cc").effective() != dv4.effective()
    assert model_config("micro", residual="baseline", kernels="compiled").effective() == base.effective()
    # the d_v-axis conv's padding matters only for cc/cc_ec with more than one tap; init and norms always
    assert model_config("micro", residual="ddl", dv=4, cc_padding="causal").effective() == dv4.effective()
    assert model_config("micro", residual="baseline", cc_padding="causal").effective() == base.effective()
    cc = model_config("micro", residual="ddl", dv=4, conv="cc")
    assert model_config("micro", residual="ddl", dv=4, conv="cc", cc_padding="causal").effective() != cc.effective()
    assert model_config("micro", residual="ddl", dv=4, conv="cc", state_conv_kernel=1, cc_padding="causal"
                        ).effective() == model_config("micro", residual="ddl", dv=4, conv="cc",
                                                      state_conv_kernel=1).effective()
    for change in (dict(init="gpt2"), dict(norm_eps=1e-6), dict(qk_norm="before_rope")):
        assert model_config("micro", residual="baseline", **change).effective() != base.effective()


@pytest.mark.parametrize("overrides, key", [
    (dict(dv=0), "dv"),
    (dict(dv=2.5), "dv"),
    (dict(residual="sum"), "residual"),
    (dict(conv="xx"), "conv"),
    (dict(mapping="q"), "mapping"),
    (dict(beta_init=3.0), "beta_init"),
    (dict(beta_init=-0.1), "beta_init"),
    (dict(beta_estimator="deep"), "beta_estimator"),
    (dict(n_head=3), "d_model"),
    (dict(residual="ddl", dv=1, conv="ec"), "conv"),
    (dict(residual="ddl", dv=4, conv="cc", state_conv_kernel=5), "state_conv_kernel"),
    (dict(k_eps=-1.0), "k_eps"),
    (dict(kernels="triton"), "kernels"),
    (dict(init="xavier"), "init"),
    (dict(cc_padding="left"), "cc_padding"),
    (dict(qk_norm="never"), "qk_norm"),
    (dict(norm_eps=-1e-5), "norm_eps"),
    (dict(n_layer=0), "n_layer"),
])
def test_invalid_configs_raise_one_clear_line(overrides, key):
    with pytest.raises(ValueError) as err:
        model_config("micro", **overrides)
    message = str(err.value)
    assert message.startswith(f"{key}=") and "\n" not in message


def test_unknown_size():
    with pytest.raises(ValueError, match=r"^model='huge': must be one of micro, tiny, mini, small, medium, large$"):
        model_config("huge")
