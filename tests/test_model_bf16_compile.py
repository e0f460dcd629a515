"""Every model variant under bf16 autocast and compiled per block (as train.compile does), on TEST_DEVICE: CPU
here (the fused ops' C++ loops); on a GPU (`make gpu-check`) CUDA, where they are the Triton kernels."""

import pytest
import torch

from ddl.model import GPT, model_config
from tests.conftest import TEST_DEVICE, slow_except
from tests.test_model_gpt import VARIANTS, VOCAB

# bf16 keeps 8 significant bits; the logits' rounding errors mostly average out in the mean loss
# (measured at init on CPU: <= 6e-4 of ~4.2) and in the gradients (relative L2 error <= 2.4%).
BF16_LOSS_ATOL, BF16_GRAD_RTOL = 5e-3, 0.05


def micro(name: str, state_dtype: str = "fp32") -> GPT:
    """The variant at the micro size; the state in fp32 unless asked (the bf16 run: 'auto', bf16 on CUDA)."""
    torch.manual_seed(0)
    cfg = VARIANTS[name] | ({"state_dtype": state_dtype} if VARIANTS[name].get("residual") == "ddl" else {})
    return GPT(model_config("micro", vocab_size=VOCAB, **cfg)).to(TEST_DEVICE)


def loss_and_grads(model, forward=None, T=32, autocast=False) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss on fixed tokens and all parameters' gradients, flattened into one vector."""
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1)).to(TEST_DEVICE)
    with torch.autocast(TEST_DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
        _, loss = (model if forward is None else forward)(idx, idx.roll(-1, 1))
    loss.backward()
    return loss.detach().float(), torch.cat([p.grad.flatten().float() for p in model.parameters()])


@pytest.mark.parametrize("name", VARIANTS)
def test_bf16_autocast_gives_the_fp32_numbers(name):
    loss, grads = loss_and_grads(micro(name))
    loss_bf16, grads_bf16 = loss_and_grads(micro(name, state_dtype="auto"), autocast=True)
    assert torch.isfinite(loss_bf16) and torch.isfinite(grads_bf16).all()
    assert abs(loss_bf16 - loss) <= BF16_LOSS_ATOL
    assert (grads_bf16 - grads).norm() <= BF16_GRAD_RTOL * grads.norm()


@pytest.fixture
def fresh_dynamo():
    """Each compile starts from an empty cache (the blocks' and the head's code objects, compiled per variant)."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def assert_compiled_gives_the_eager_numbers(name: str, backend: str) -> None:
    eager = loss_and_grads(micro(name), T=12)
    model = micro(name)
    model.compile_blocks(backend)                                         # fullgraph: a graph break raises
    compiled = loss_and_grads(model, T=12)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", slow_except({name: name for name in VARIANTS}, "ddl_dv4"))
def test_every_variant_traces_as_one_graph_forward_and_backward(name, fresh_dynamo):
    """fullgraph=True raises on any graph break; aot_eager traces forward and backward (AOTAutograd,
    our ops through their fakes) and runs the traced graphs without inductor's code generation."""
    assert_compiled_gives_the_eager_numbers(name, "aot_eager")


@pytest.mark.slow
def test_inductor_compiles_the_blocks_with_the_fused_ops(fresh_dynamo):
    """One variant with every fused op (update, time-conv read, rank-1 read, EC expansion, norm)
    through inductor, as train.compile=true does."""
    assert_compiled_gives_the_eager_numbers("ddl_dv4_ec", "inductor")
