"""Reference parity: with the authors' weights, our GPT computes the authors' function.

tests/fixtures/reference_parity.pt holds, per variant, a tiny model (vocab 32, 2 layers, d=8, 2
heads, d_v=4) of the authors' code (GitHub yifanzhang-pro/deep-delta-learning, model/) with every
parameter moved off its init (so norm weights, read vectors and biases matter), its float64 logits
and loss on fixed tokens, and the loss gradients. The numbers came from a throw-away harness that
ran their code on CPU (causal_conv1d_fn as F.conv1d, their fp32 casts kept at float64); no code
of theirs is here.
"""

import math
import re

import pytest
import torch

from ddl.model import GPT, model_config
from ddl.model.reference import ReferenceMismatch, load_reference, to_ours

FIXTURE = torch.load(__import__("pathlib").Path(__file__).parent / "fixtures" / "reference_parity.pt",
                     weights_only=True)


def unflatten(names, shapes, flat, dtype=torch.float64):
    out, offset = {}, 0
    for name, shape in zip(names, shapes, strict=True):
        n = math.prod(shape)
        out[name] = flat[offset:offset + n].view(shape).to(dtype)
        offset += n
    return out


def reference_state_dict(variant):
    case = FIXTURE[variant]
    return unflatten(case["names"], case["shapes"], case["weights"])


@pytest.mark.parametrize("variant", list(FIXTURE))
def test_our_model_with_the_authors_weights_gives_their_logits_and_gradients(variant):
    case = FIXTURE[variant]
    model = load_reference(reference_state_dict(variant), variant, max_seq_len=16).double()
    logits, loss = model(case["idx"], case["targets"])
    assert (logits - case["logits"]).abs().max() < 1e-10
    assert abs(loss.item() - case["loss"].item()) < 1e-12
    loss.backward()
    shapes = dict(zip(case["names"], case["shapes"], strict=True))
    expected = to_ours(unflatten(case["grad_names"], [shapes[n] for n in case["grad_names"]], case["grads"]),
                       model, strict=False)
    assert expected.keys() == {name for name, _ in model.named_parameters()}
    for name, param in model.named_parameters():
        assert (param.grad - expected[name]).abs().max() < 1e-9, name


def test_the_previous_defaults_do_not_reproduce_the_authors_model():
    """Each parity choice that changes the function (norm eps, QK-norm order, CC padding) matters here."""
    case = FIXTURE["ddl_dv4_cc"]
    state = load_reference(reference_state_dict("ddl_dv4_cc"), "ddl_dv4_cc").state_dict()
    for change in (dict(norm_eps=1e-6), dict(qk_norm="before_rope"), dict(cc_padding="causal")):
        cfg = model_config("micro", vocab_size=32, n_layer=2, n_head=2, d_model=8, max_seq_len=16, residual="ddl",
                           dv=4, conv="cc", **change)
        model = GPT(cfg).double()
        model.load_state_dict(state)
        logits, _ = model(case["idx"])
        assert (logits - case["logits"]).abs().max() > 1e-8, change


@pytest.mark.parametrize("variant, wrong, message", [
    ("ddl_dv1", "ddl_dv4", "missing transformer.h.0.compress.shortconv.weight"),
    ("ddl_dv4", "ddl_dv1", "transformer.h.0.ddl_attn.v_proj.weight has shape (4, 8), the variant needs (1, 8)"),
    ("ddl_dv4_cc", "ddl_dv4", "missing transformer.h.0.compress.shortconv.weight"),
    ("ddl_dv4", "baseline", "unexpected tensor transformer.h.0.compress.read (4,)"),
])
def test_a_state_dict_of_another_variant_is_refused_naming_the_first_offender(variant, wrong, message):
    with pytest.raises(ReferenceMismatch, match=re.escape(message)) as err:
        load_reference(reference_state_dict(variant), wrong)
    assert "\n" not in str(err.value)


def test_a_mis_shaped_tensor_is_named_with_both_shapes():
    state = reference_state_dict("ddl_dv4")
    state["transformer.h.1.ddl_mlp.v_proj.weight"] = torch.zeros(3, 8)
    with pytest.raises(ReferenceMismatch, match=r"v_proj\.weight has shape \(3, 8\), the variant needs \(4, 8\)"):
        load_reference(state, "ddl_dv4")


def test_wrapped_names_of_ddp_and_compile_are_accepted():
    state = {f"module._orig_mod.{k}": v for k, v in reference_state_dict("ddl_dv4_ec").items()}
    case = FIXTURE["ddl_dv4_ec"]
    logits, _ = load_reference(state, "ddl_dv4_ec", max_seq_len=16).double()(case["idx"])
    assert (logits - case["logits"]).abs().max() < 1e-10


def _std(model, suffixes):
    return torch.cat([p.detach().flatten() for n, p in model.named_parameters() if n.endswith(suffixes)]).std().item()


@pytest.mark.parametrize("conv", ["none", "cc_ec"])
def test_reference_init_statistics_at_the_small_size(conv):
    torch.manual_seed(0)
    model = GPT(model_config("small", vocab_size=2048, residual="ddl", dv=4, conv=conv, beta_init=0.5))
    d, L = 768, 12
    expected = {("attn.qkv.weight", "mlp.w_gate.weight", "mlp.w_up.weight", "W_v.weight", "beta_gate.weight"):
                0.5 / d ** 0.5,
                ("attn.proj.weight", "mlp.w_down.weight"): 0.5 / (d * L) ** 0.5,
                ("compress.weight", "readout.weight"): 0.5 / d ** 0.5,                 # time or channel conv
                ("wte.weight",): 0.02}
    for suffixes, std in expected.items():
        assert abs(_std(model, suffixes) / std - 1) < 0.03, suffixes
    W_v_bias = torch.cat([m.W_v.bias for _, m in model.delta_residuals()]).detach()
    assert W_v_bias.abs().max() <= d ** -0.5 and W_v_bias.std() > 0.3 * d ** -0.5      # Linear's U(+-1/sqrt(d))
    for _, delta in model.delta_residuals():
        assert torch.allclose(delta.beta_gate.bias, torch.tensor(math.log(0.25 / 0.75)))
    assert all(torch.equal(block.compress.read, torch.full((4,), 0.25)) for block in model.blocks)
    assert all(torch.equal(p, torch.ones_like(p)) for n, p in model.named_parameters() if "norm" in n)
    if conv == "cc_ec":
        assert torch.equal(model.expand.taps()[..., -1], torch.ones(4, d)) and not model.expand.taps()[..., :-1].any()


def test_gpt2_init_statistics_at_the_small_size():
    torch.manual_seed(0)
    model = GPT(model_config("small", vocab_size=2048, residual="ddl", dv=4, init="gpt2"))
    assert abs(_std(model, ("attn.qkv.weight", "mlp.w_up.weight", "W_v.weight")) / 0.02 - 1) < 0.03
    assert abs(_std(model, ("attn.proj.weight", "mlp.w_down.weight")) / (0.02 / 24 ** 0.5) - 1) < 0.03
    assert not any(m.W_v.bias.any() for _, m in model.delta_residuals())
