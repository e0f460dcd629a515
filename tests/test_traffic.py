"""ddl.traffic: a training step's memory traffic counted from its op stream on fake tensors (no GPU), and
`python -m ddl.bench --traffic`, which holds the GPU step to its targets."""

import json
import subprocess
import sys

import torch

from ddl.bench import SAVED_TARGET, TRAFFIC_TARGETS
from ddl.model.torch_private import FakeTensorMode
from ddl.traffic import OpCounter


@torch.library.custom_op("ddl_test::axpby", mutates_args=())
def axpby(x: torch.Tensor, y: torch.Tensor, a: float) -> torch.Tensor:
    """A fused op whose inside is three ops: the counter sees one."""
    return (x * a + y).relu()


@axpby.register_fake
def _(x, y, a):
    return torch.empty_like(x)


def test_an_op_counts_its_inputs_and_outputs_once_and_a_view_nothing():
    x, y = torch.randn(1000), torch.randn(1000)                       # 4,000 B each, fp32
    counter = OpCounter()
    with counter:
        z = x + y                                                     # reads 8,000 B, writes 4,000 B
        z.view(10, 100).t()                                           # views: free
        axpby(x, z.to(torch.bfloat16), 2.0)                           # a cast (4,000 + 2,000 B), then the fused op
    assert counter.bytes["memory"] == 12_000 + 6_000 + (4_000 + 2_000 + 4_000)
    assert sum(counter.calls.values()) == 3
    assert counter.by_op["ddl_test::axpby"] == 10_000


def test_a_matmul_is_compute_and_a_skinny_product_memory():
    counter = OpCounter()
    with FakeTensorMode(), counter:
        a, b, gate = torch.empty(64, 32), torch.empty(32, 48), torch.empty(32, 1)
        a @ b                                                         # every side >= 16: a matmul
        a @ gate                                                      # a d -> 1 map: memory traffic
    assert counter.bytes["matmul"] == (64 * 32 + 32 * 48 + 64 * 48) * 4
    assert counter.bytes["memory"] == (64 * 32 + 32 + 64) * 4


def test_the_gpu_step_of_ddl_meets_its_traffic_and_memory_targets(tmp_path):
    """The paper's small size, 16 x 1024 tokens, counted as a GPU runs it: d_v=4 moves at most 8 GB more than the
    baseline outside its matmuls, d_v=1 at most 2 GB, and d_v=4 holds at most 1.3x the baseline's activations."""
    done = subprocess.run([sys.executable, "-m", "ddl.bench", "--traffic", "--arms", "baseline,ddl_dv1,ddl_dv4",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    arms = json.loads((tmp_path / "traffic.json").read_text())["arms"]
    assert list(arms) == ["baseline", "ddl_dv1", "ddl_dv4"]
    for name, bound in TRAFFIC_TARGETS.items():
        assert arms[name]["extra_non_matmul_bytes"] <= bound * 1e9, (name, arms[name])
    assert arms["ddl_dv4"]["saved_ratio"] <= SAVED_TARGET
    assert arms["ddl_dv4"]["kernel_calls"] > arms["baseline"]["kernel_calls"] > 0
    assert "| ddl_dv4 |" in (tmp_path / "traffic.md").read_text() and "MISSED" not in done.stdout
