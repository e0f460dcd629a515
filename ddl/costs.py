"""What training costs in FLOPs and GPU-hours: the dry run's estimates and the bench's MFU."""

from __future__ import annotations

# Dense bf16 peak FLOP/s of the GPUs the project plans for.
BF16_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
ASSUMED_MFU = 0.40   # the dry run's GPU-hours assume this share of the bf16 peak


def training_flops(n_params: int, tokens: int) -> float:
    """Forward + backward FLOPs of training on `tokens` tokens: 6 N per token."""
    return 6.0 * n_params * tokens


def gpu_hours(n_params: int, tokens: int, gpu: str = "H100") -> float:
    """Hours of one GPU at ASSUMED_MFU of its bf16 peak."""
    return training_flops(n_params, tokens) / (BF16_PEAK_FLOPS[gpu] * ASSUMED_MFU) / 3600
