"""µP (model.param=mup, ddl/model/mup.py): every parameter's role, the base width where it is sp, the
per-role init, learning rates and readout, and a run through ddl-run that records its parameterization."""

import dataclasses

import pytest
import torch

from ddl.model import GPT, model_config
from ddl.model.config import LATER_FIELDS
from ddl.model.mup import HIDDEN, INPUT, OUTPUT, VECTOR, optimizer_groups, role
from ddl.train import RunConfig, TrainConfig
from ddl.data import DataConfig

from .conftest import mlflow_runs, run_cli

VARIANTS = {
    "baseline": dict(residual="baseline"),
    "ddl_dv1": dict(residual="ddl", dv=1),
    "ddl_dv4_ec": dict(residual="ddl", dv=4, conv="ec"),
    "ddl_dv4_cc_v_mlp_nh2": dict(residual="ddl", dv=4, conv="cc_ec", mapping="v", beta_estimator="mlp", n_h=2),
}


def micro(width: int, param: str = "mup", base: int = 64, **kw) -> GPT:
    torch.manual_seed(0)
    return GPT(model_config("micro", vocab_size=64, d_model=width, head_size=32, param=param, mup_base_width=base,
                            **kw))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_parameter_has_a_role_and_the_base_width_is_sp_bit_for_bit(variant):
    sp, mup = micro(64, "sp", **VARIANTS[variant]), micro(64, **VARIANTS[variant])
    roles = {name: role(name, p) for name, p in mup.named_parameters()}
    assert roles["wte.weight"] == INPUT and roles["blocks.0.attn.qkv.weight"] == HIDDEN
    if variant != "baseline":
        assert roles["blocks.0.delta_attn.W_v.weight"] == OUTPUT and roles["blocks.0.delta_attn.W_v.bias"] == VECTOR
        gate = "beta_gate.0.weight" if "mlp" in variant else "beta_gate.weight"
        assert roles[f"blocks.1.delta_mlp.{gate}"] == OUTPUT
    for (name, a), b in zip(sp.named_parameters(), mup.parameters(), strict=True):
        assert torch.equal(a, b), name
    idx = torch.randint(0, 64, (2, 16))
    assert torch.equal(sp(idx)[0], mup(idx)[0])


def test_a_parameter_without_a_role_is_named():
    with pytest.raises(ValueError, match="no µP role for parameter 'blocks.0.new.weight'"):
        role("blocks.0.new.weight", torch.zeros(3, 3))


def test_width_scales_init_learning_rates_decay_and_logits_by_role():
    """At 4x the base width: hidden and output matrices at lr / 4 with weight decay x 4, output maps
    (the gates, the value map) start 1/2 as large as sp's, taps 2x (their base width's), logits / 4."""
    kw = dict(residual="ddl", dv=4)
    sp, mup = micro(256, "sp", **kw), micro(256, **kw)
    sp_params = dict(sp.named_parameters())
    for name, p in mup.named_parameters():
        ratio = (p.std() / sp_params[name].std()).item() if p.numel() > 1 and sp_params[name].std() > 0 else 1.0
        expected = {OUTPUT: 0.5, VECTOR: 2.0 if name.endswith(("compress.weight", "readout.weight", "W_v.bias"))
                    else 1.0}.get(role(name, p), 1.0)
        assert ratio == pytest.approx(expected, rel=1e-5), name
    assert mup.logit_multiplier == 0.25 and sp.logit_multiplier == 1.0
    groups = optimizer_groups(mup, mup.cfg, 1e-3, 0.1)
    scaled = {id(p) for g in groups if g["lr"] == pytest.approx(2.5e-4) for p in g["params"]}
    assert all(g["weight_decay"] == pytest.approx(0.4) for g in groups if g["lr"] < 1e-3 and g["weight_decay"])
    for name, p in mup.named_parameters():
        assert (id(p) in scaled) == (role(name, p) in (HIDDEN, OUTPUT)), name


def test_mup_settings_are_checked_and_sp_signatures_ignore_the_base_width():
    with pytest.raises(ValueError, match=r"^init='gpt2': must be reference with param=mup"):
        model_config("micro", param="mup", init="gpt2")
    with pytest.raises(ValueError, match=r"^param='mu': must be one of sp, mup"):
        model_config("micro", param="mu")
    data = DataConfig()

    def signature(**model) -> str:
        return RunConfig(model_config("micro", vocab_size=data.model_vocab_size(), **model), data, TrainConfig(),
                         seed=0).signature()

    assert signature() == signature(mup_base_width=32) != signature(param="mup")
    assert signature(param="mup") != signature(param="mup", mup_base_width=32)
    sp = model_config("micro", vocab_size=data.model_vocab_size())
    assert RunConfig(sp, data, TrainConfig(), 0).effective_dict()["model"].keys() == \
        dataclasses.asdict(sp).keys() - set(LATER_FIELDS)


@pytest.mark.slow
def test_a_mup_run_through_ddl_run_records_its_parameterization(ddl_home):
    ran = run_cli("ddl-run", "model=micro", "train=smoke", "train.steps=4", "model.param=mup",
                  "model.mup_base_width=32", "experiment=mup")
    assert ran.returncode == 0, ran.stderr[-2000:]
    (run,) = mlflow_runs("mup")
    assert run.info.status == "FINISHED"
    assert run.data.params["model.param"] == "mup" and run.data.params["model.mup_base_width"] == "32"
    refused = run_cli("ddl-run", "model=micro", "model.param=mup", "model.init=gpt2", "experiment=mup2")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "ddl-run: error: init='gpt2': must be reference with param=mup (µP scales the reference init by width)"]
    assert mlflow_runs("mup2") == []


def test_the_report_keeps_sp_and_mup_runs_apart_and_names_the_base_width():
    """Runs logged before model.param existed read as sp (ddl.track.query.load_runs)."""
    import pandas as pd
    from ddl.report.tables import variant_rows
    runs = pd.DataFrame({"params.model.size": ["tiny"] * 4, "params.model.row": ["ddl_dv4"] * 4,
                         "params.seed": ["0", "1", "0", "1"], "params.model.param": ["sp", "sp", "mup", "mup"],
                         "params.model.mup_base_width": [None, None, "64", "64"]})
    assert list(variant_rows(runs)) == ["ddl_dv4 model.param=sp"] * 2 + \
        ["ddl_dv4 model.param=mup model.mup_base_width=64"] * 2


def test_head_size_keeps_heads_of_a_fixed_size_as_width_grows():
    assert [model_config("micro", d_model=w, head_size=32).n_head for w in (64, 128, 256)] == [2, 4, 8]
    with pytest.raises(ValueError, match=r"^head_size=48: must divide d_model=64$"):
        model_config("micro", head_size=48)


@pytest.mark.parametrize("variant", VARIANTS)
def test_completep_at_its_base_depth_is_the_reference_model_bit_for_bit(variant):
    none, completep = micro(64, **VARIANTS[variant]), micro(64, depth_param="completep", depth_base=2,
                                                            **VARIANTS[variant])
    for (name, a), b in zip(none.named_parameters(), completep.parameters(), strict=True):
        assert torch.equal(a, b), name
    idx = torch.randint(0, 64, (2, 16))
    assert torch.equal(none(idx)[0], completep(idx)[0])
    def settings(model):
        return [{k: v for k, v in g.items() if k != "params"} | {"n": len(g["params"])}
                for g in optimizer_groups(model, model.cfg, 1e-3, 0.1)]
    assert settings(none) == settings(completep)


def test_completep_scales_each_branch_or_write_its_init_and_eps_by_depth():
    """At 4x its base depth: the baseline's branches and DDL's write (the value, never beta) times 1/4, the
    output projections' init at the base depth's, Adam's eps of the blocks' parameters times 1/4."""
    from ddl.model.mup import ADAM_EPS
    deep = dict(n_layer=8, depth_param="completep", depth_base=2)
    base, ddl = micro(64, **deep, residual="baseline"), micro(64, **deep, residual="ddl", dv=4)
    assert {b.branch_scale for b in base.blocks} == {0.25}
    ref = micro(64, n_layer=8, residual="ddl", dv=4)
    assert {d.v_scale for _, d in ddl.delta_residuals()} == {0.25 * d.v_scale for _, d in ref.delta_residuals()}
    assert {d.beta_bias_init for _, d in ddl.delta_residuals()} == {d.beta_bias_init for _, d in ref.delta_residuals()}
    proj = base.blocks[0].attn.proj.weight.std().item()
    assert proj == pytest.approx(0.5 / (64 * 2) ** 0.5, rel=0.05)            # N(0, 0.5/sqrt(d L_base)), not L=8's
    for model in (base, ddl):
        groups = optimizer_groups(model, model.cfg, 1e-3, 0.1)
        eps = {id(p): g.get("eps", ADAM_EPS) for g in groups for p in g["params"]}
        for name, p in model.named_parameters():
            assert eps[id(p)] == (0.25 * ADAM_EPS if name.startswith("blocks.") else ADAM_EPS), name


def test_the_depth_parameterization_enters_the_signature_only_when_it_is_on():
    data = DataConfig()

    def signature(**model) -> str:
        return RunConfig(model_config("micro", vocab_size=data.model_vocab_size(), **model), data, TrainConfig(),
                         seed=0).signature()

    assert signature() == signature(depth_base=8) == signature(logit_mult=1, embed_lr_mult=1.0)
    assert len({signature(), signature(depth_param="completep"), signature(depth_param="completep", depth_base=8),
                signature(logit_mult=2.0), signature(embed_lr_mult=2.0)}) == 5
    assert signature(logit_mult=2) == signature(logit_mult=2.0)


def test_the_base_width_multipliers_scale_the_logits_and_the_embeddings_lr():
    plain, scaled = micro(128, residual="baseline"), micro(128, residual="baseline", logit_mult=3.0, embed_lr_mult=4.0)
    assert plain.logit_multiplier == 0.5 and scaled.logit_multiplier == 1.5
    lrs = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer_groups(scaled, scaled.cfg, 1e-3, 0.1)
           for p in g["params"]}
    assert lrs[id(scaled.wte.weight)] == (pytest.approx(4e-3), pytest.approx(0.025))     # lr * wd kept
    assert lrs[id(scaled.blocks[0].attn.qkv.weight)] == (pytest.approx(5e-4), pytest.approx(0.2))


@pytest.mark.parametrize("override, line", [
    ("train.warmup_frac=1.5", "train.warmup_frac=1.5: must be null (train.warmup_steps sets the warmup) or a number "
                              "in [0, 1) (the run's share)"),
    ("model.depth_param=cubic", "depth_param='cubic': must be one of none, completep"),
    ("model.depth_base=0", "depth_base=0: must be an integer >= 1"),
    ("model.logit_mult=0", "logit_mult=0.0: must be a finite number > 0 (a multiplier; 1: none)"),
    ("model.embed_lr_mult=-2", "embed_lr_mult=-2.0: must be a finite number > 0 (a multiplier; 1: none)")])
def test_a_bad_schedule_or_parameterization_key_is_one_line_exit_2_and_nothing_created(ddl_home, override, line):
    out = run_cli("ddl-run", "model=micro", override, "experiment=bad")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [f"ddl-run: error: {line}"], out.stderr
    assert mlflow_runs("bad") == [] and not (ddl_home / "runs").exists()
