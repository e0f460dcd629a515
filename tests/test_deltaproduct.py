"""DeltaProduct on the residual stream (ModelConfig.n_h): n_h Delta updates per sublayer, in float64.

The composed transition of a sublayer is the map X -> X_new with v = 0 (the state's own part),
read off the real module: tokens that share (h, x_in) share every step's (k_j, beta_j, v_j), so
feeding the states e_1..e_d and 0 gives M e_i + C and C, hence M.
"""

import dataclasses

import pytest
import torch
from torch import nn

from ddl.model import GPT, SIZES, ModelConfig, model_config, param_count
from ddl.model.delta import DeltaResidual, SublayerInput, delta_update_steps
from ddl.model.fused import FusedDeltaSteps, update_steps
from tests.test_model_math import loops  # noqa: F401  (the fixture: the C++ loops, then the PyTorch-op ones)

D = 8


pytestmark = pytest.mark.usefixtures("float64_default")   # tests/conftest.py


def sublayer(n_h: int, dv: int = 1, mapping: str = "k", k_eps: float = 1e-5, seed: int = 0) -> DeltaResidual:
    torch.manual_seed(seed)
    delta = DeltaResidual(ModelConfig(d_model=D, n_head=2, residual="ddl", dv=dv, mapping=mapping, n_h=n_h,
                                      k_eps=k_eps))
    for p in delta.parameters():
        nn.init.normal_(p, 0.0, 0.7)
    return delta


def inputs(delta: DeltaResidual, x_in: torch.Tensor, norm: nn.RMSNorm) -> SublayerInput:
    return delta.read_input(x_in, norm)


def eq_2_5(X: torch.Tensor, k_raw: torch.Tensor, beta: torch.Tensor, v: torch.Tensor, k_eps: float) -> torch.Tensor:
    """X + beta k (v^T - k^T X) on the stored (..., dv, d) state, k = k~ / sqrt(|k~|^2 + eps^2)."""
    k = k_raw / torch.sqrt((k_raw * k_raw).sum(-1, keepdim=True) + k_eps ** 2)
    proj = (X * k.unsqueeze(-2)).sum(-1)                                     # k^T X: (..., dv)
    return X + (beta * (v - proj)).unsqueeze(-1) * k.unsqueeze(-2)


@pytest.mark.parametrize("n_h, dv, mapping", [(2, 1, "k"), (3, 4, "k"), (2, 4, "v"), (3, 1, "v")])
def test_n_h_steps_are_n_h_sequential_delta_updates(n_h, dv, mapping):
    """Each step's (k_j, beta_j, v_j) from its own maps (step 1 the paper's, steps j >= 2: W_k^j h,
    gate of c, value of x_in or h), applied one after another by Eq. 2.5; and the gradients of every
    parameter and input are those of that plain form (the module folds the steps' gate and value maps
    into one norm_projections)."""
    delta, norm = sublayer(n_h, dv, mapping), nn.RMSNorm(D, eps=1e-5)
    x_in, h = torch.randn(2, 5, D, requires_grad=True), torch.randn(2, 5, D, requires_grad=True)
    X = torch.randn(2, 5, dv, D)
    c = norm(x_in)
    s = delta.v_scale
    if mapping == "k":
        steps = [(h, delta.beta_gate(c), s * torch.sigmoid(delta.W_v(x_in)))]
    else:
        steps = [(delta.phi_k(c if dv == 1 else x_in), delta.beta_gate(c), s * torch.sigmoid(delta.W_v(h)))]
    for step in delta.further:
        steps.append((step.W_k(h), step.beta_gate(c), s * torch.sigmoid(step.W_v(x_in if mapping == "k" else h))))
    expected = X
    for k_raw, logits, v in steps:
        expected = eq_2_5(expected, k_raw, 2 * torch.sigmoid(logits), v, delta.k_eps)

    new, writes = delta.update(X, h, inputs(delta, x_in, norm))
    assert len(writes) == n_h and len(delta.last_betas) == n_h
    torch.testing.assert_close(new, expected, rtol=1e-12, atol=1e-12)
    composed = X + sum(w.unsqueeze(-1) * k_raw.unsqueeze(-2) for w, k_raw in writes)   # a rank-n_h write
    torch.testing.assert_close(composed, new, rtol=1e-12, atol=1e-12)
    leaves = [x_in, h, *delta.parameters(), *norm.parameters()]
    G = torch.randn(new.shape)
    for a, b in zip(torch.autograd.grad((new * G).sum(), leaves), torch.autograd.grad((expected * G).sum(), leaves),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def transition(delta: DeltaResidual, seed: int = 1) -> torch.Tensor:
    """M (d x d) with X_new = M X + C for d_v = 1, read off the module (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    x_in, h = torch.randn(1, 1, D, generator=g), torch.randn(1, 1, D, generator=g)
    states = torch.cat([torch.eye(D), torch.zeros(1, D)]).view(1, D + 1, 1, D)         # e_1..e_d, 0
    norm = nn.RMSNorm(D, eps=1e-5)
    new, _ = delta.update(states, h.expand(1, D + 1, D), inputs(delta, x_in.expand(1, D + 1, D), norm))
    new = new.view(D + 1, D)
    return (new[:D] - new[D]).T                                                         # column i: M e_i


def set_betas(delta: DeltaResidual, logits: list[float]) -> None:
    """beta_j = 2 sigmoid(logit_j) for every token: the gates' weights zeroed, their biases set."""
    with torch.no_grad():
        for gate, logit in zip(delta.gate_outputs(), logits, strict=True):
            gate.weight.zero_()
            gate.bias.fill_(logit)


@pytest.mark.parametrize("n_h", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_composed_transition_is_a_contraction_of_rank_n_h_for_beta_in_0_2(n_h, seed):
    delta = sublayer(n_h, seed=seed)
    set_betas(delta, torch.empty(n_h).uniform_(-6, 6, generator=torch.Generator().manual_seed(seed)).tolist())
    assert all(0 < b.max() < 2 for b in [2 * torch.sigmoid(g.bias) for g in delta.gate_outputs()])
    M = transition(delta)
    assert torch.linalg.matrix_norm(M, ord=2) <= 1 + 1e-12
    assert torch.linalg.matrix_rank(torch.eye(D) - M, atol=1e-10) <= n_h


@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_with_every_beta_2_the_transition_is_orthogonal_with_determinant_minus_1_to_the_n_h(n_h):
    delta = sublayer(n_h, k_eps=0.0)                 # unit keys exactly: each step a Householder reflection
    set_betas(delta, [40.0] * n_h)                  # 2 sigmoid(40) == 2 in float64
    M = transition(delta)
    torch.testing.assert_close(M @ M.T, torch.eye(D), rtol=0, atol=1e-12)
    assert torch.linalg.det(M).item() == pytest.approx((-1) ** n_h, abs=1e-12)


def step_inputs(S: int, dv: int, seed: int = 4) -> list[torch.Tensor]:
    """X (2,3,dv,D), then each step's k~ (2,3,D), beta (2,3,1) in [0, 2), v (2,3,dv): flat."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(D,), (1,), (dv,)] * S
    out = [torch.randn(2, 3, dv, D, generator=g)]
    out += [2 * torch.rand(2, 3, *shape, generator=g) if n % 3 == 1 else torch.randn(2, 3, *shape, generator=g)
            for n, shape in enumerate(shapes)]
    return out


def by_step(flat: list[torch.Tensor]) -> list[tuple]:
    return list(zip(flat[0::3], flat[1::3], flat[2::3], strict=True))


@pytest.mark.usefixtures("loops")
@pytest.mark.parametrize("S, dv", [(2, 1), (2, 4), (3, 4)])
@pytest.mark.parametrize("loss_on_writes", [True, False], ids=["writes read", "writes unread"])
def test_the_fused_steps_are_the_plain_steps_in_value_and_gradient(S, dv, loss_on_writes):
    """One pass over the state for a sublayer's S updates (FusedDeltaSteps) against S plain delta_update
    calls: X_S, every w_s, and the gradients of X and of every step's k~, beta, v, with dL/dw given (the
    attention's writes, read by the MLP's compressor) or absent (the MLP's)."""
    plain_in, fused_in = ([t.clone().requires_grad_() for t in step_inputs(S, dv)] for _ in range(2))
    plain = delta_update_steps(plain_in[0], by_step(plain_in[1:]), 1e-5)
    fused = update_steps(fused_in[0], by_step(fused_in[1:]), 1e-5)
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(plain[0].shape, generator=g)] + [torch.randn(w.shape, generator=g) for w in plain[1]]
    for X, ws in (plain, fused):
        on_writes = sum((w * c).sum() for w, c in zip(ws, weights[1:], strict=True))
        ((X * weights[0]).sum() + loss_on_writes * on_writes).backward()
    for a, b in zip([plain[0], *plain[1]], [fused[0], *fused[1]], strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-12)
    for n, (a, b) in enumerate(zip(plain_in, fused_in, strict=True)):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-12, msg=f"input {n}")
    assert torch.autograd.gradcheck(lambda X, *steps: FusedDeltaSteps.apply(X, 1e-5, *steps),
                                    [t.clone().requires_grad_() for t in step_inputs(S, dv, seed=6)])


@pytest.mark.usefixtures("loops")
def test_the_fused_steps_keep_the_state_in_fp32_under_bf16_autocast():
    inputs = [t.float() for t in step_inputs(2, 4)]
    plain, _ = FusedDeltaSteps.apply(inputs[0], 1e-5, *inputs[1:])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast, _ = FusedDeltaSteps.apply(inputs[0], 1e-5, *inputs[1:])
    assert autocast.dtype == torch.float32 and torch.equal(autocast, plain)


def test_n_h_1_is_the_paper_model_with_its_signature():
    """n_h = 1 adds no module and no parameter, and is left out of the effective config: the run
    signatures written before n_h existed still hold (these are +sweep=proxy's, from then)."""
    from hydra import compose, initialize_config_dir

    from ddl.launch.configs import conf_dir, register
    from ddl.launch.spec import Job

    register()
    before = {"baseline": "f591918ead4c", "ddl_dv1": "1ddf8be974f8", "ddl_dv4": "3c6b575233f2",
              "ddl_dv4_cc_ec": "ea72a2d4822f"}
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        jobs = {row: Job.from_config(compose("config", overrides=["+sweep=proxy", f"+variant={row}", "seed=0"]))
                for row in before}
        two = Job.from_config(compose("config", overrides=["+sweep=proxy", "+variant=ddl_dv4", "seed=0",
                                                           "ddl.n_h=2"]))
    assert {row: job.signature for row, job in jobs.items()} == before
    assert "n_h" not in jobs["ddl_dv4"].run.effective_dict()["model"]
    assert two.params()["model.n_h"] == 2 and two.name == "ddl_dv4_nh2-tiny-s0"
    assert two.signature not in before.values()
    cfg = jobs["ddl_dv4"].run.model
    assert {n for n, _ in GPT(cfg).named_parameters()} == \
        {n for n, _ in GPT(dataclasses.replace(cfg, n_h=2)).named_parameters() if ".further." not in n}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_param_count_matches_the_built_model_for_every_size_and_n_h(size, n_h):
    for variant in (dict(dv=1), dict(dv=4, conv="cc"), dict(dv=4, conv="ec", mapping="v", beta_estimator="mlp")):
        cfg = model_config(size, residual="ddl", n_h=n_h, **variant)
        with torch.device("meta"):                # the shapes without the memory or the init
            assert GPT(cfg).num_params() == param_count(cfg), (size, variant)


def test_n_h_must_be_a_positive_integer():
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match=r"^n_h="):
            ModelConfig(residual="ddl", n_h=bad)


def test_every_beta_and_the_state_rank_are_diagnosed_per_layer_and_step():
    cfg = model_config("micro", vocab_size=64, residual="ddl", dv=4, n_h=2)
    model = GPT(cfg)
    idx = torch.randint(0, 64, (2, 16))
    model(idx)
    stats = model.beta_stats()
    for layer in range(cfg.n_layer):
        for part in ("attn", "mlp"):
            for name in (f"L{layer:02d}.{part}", f"L{layer:02d}.{part}.j2"):
                assert 0 <= stats[f"beta/{name}/frac_gt1"] <= 1 and 0 < stats[f"beta/{name}/mean"] < 2
    ranks = model.state_ranks(idx)
    assert sorted(ranks) == [f"erank/L{i:02d}" for i in range(cfg.n_layer)]
    assert all(1 - 1e-9 <= r <= cfg.dv + 1e-9 for r in ranks.values())
    assert GPT(dataclasses.replace(cfg, dv=1)).state_ranks(idx) == {}


def test_effective_rank_is_1_for_a_rank_one_state_and_d_v_for_orthonormal_rows():
    from ddl.model.gpt import effective_rank
    k = torch.randn(D)
    rank_one = torch.outer(torch.tensor([1.0, -2.0, 0.5, 3.0]), k)                # (dv, d), rows parallel
    orthonormal = torch.linalg.qr(torch.randn(D, 4)).Q.T                          # (dv, d), equal singular values
    torch.testing.assert_close(effective_rank(torch.stack([rank_one, orthonormal])),
                               torch.tensor([1.0, 4.0]), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_two_job_smoke_sweep_with_n_h_2_logs_every_step_and_reports_its_table(ddl_home, tmp_path):
    """The real app: d_v = 1 and 4 at n_h = 2 train, log each step's beta and the state's rank by
    layer, and `ddl-report` builds the DeltaProduct table and the diagnostics figure from them."""
    from tests.conftest import mlflow_runs, run_cli
    done = run_cli("ddl-run", "-m", "model=micro", "train=smoke", "residual=ddl", "dv=1,4", "ddl.n_h=2",
                   "experiment=product")
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {r.info.run_name: r for r in mlflow_runs("product")}
    assert sorted(runs) == ["ddl_dv1_nh2-micro-s0", "ddl_dv4_nh2-micro-s0"]
    for run in runs.values():
        assert run.info.status == "FINISHED" and run.data.params["model.n_h"] == "2"
        assert {"beta/L01.mlp/mean", "beta/L01.mlp.j2/mean", "beta/L01.mlp.j2/frac_gt1"} <= run.data.metrics.keys()
    assert {"erank/L00", "erank/L01"} <= runs["ddl_dv4_nh2-micro-s0"].data.metrics.keys()
    assert not any(key.startswith("erank/") for key in runs["ddl_dv1_nh2-micro-s0"].data.metrics)
    report = run_cli("ddl-report", "--experiment", "product", "--out", str(tmp_path / "reports"))
    assert report.returncode == 0, report.stderr[-3000:]
    table = (tmp_path / "reports" / "product" / "deltaproduct.md").read_text()
    assert "| DDL (d_v=1) n_h=2 |" in table and "| DDL (d_v=4) n_h=2 |" in table
    assert (tmp_path / "reports" / "product" / "diagnostics_micro.png").stat().st_size > 0
