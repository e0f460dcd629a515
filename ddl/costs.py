"""What training costs: FLOPs, GPU-hours and memory per GPU (the dry run's estimates), and the bench's MFU.

A GPU job's time per token is the baseline's, 6 N FLOPs at the MFU `make gpu-check` measured, times its arm's step
ratio to the baseline (both recorded in recorded_costs.json): the one gpu-check measured for the arm's d_v (1 or 4)
where there is one, plus the traffic the arm moves beyond that measured arm (ddl.traffic, counted per token, layer and
feature in traffic_table.json) at the measured copy rate; else 1 plus its whole extra traffic at that rate. Its memory
per GPU is the weights, gradients and AdamW's moments (16 bytes a parameter) plus the activations autograd saves (the
same table) times the measured ratio of a step's peak to them. No torch here: the dry run stays fast.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

# Dense bf16 peak FLOP/s of the GPUs the project plans for.
BF16_PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
# What `make gpu-check` and `make bench` measured, as they recorded it (`--record`): the GPU's baseline MFU, copy rate,
# peak memory over saved activations and each arm's step ratio; the CPU's step ratios.
RECORDED_COSTS = Path(__file__).with_name("recorded_costs.json")


@functools.cache
def recorded() -> dict:
    """{'gpu': {card, date, baseline_mfu, copy_bytes_per_s, peak_over_saved, step_ratios}, 'cpu': {machine, date,
    step_ratios}}: the figures the dry run and the report's equal-compute verdicts are priced from."""
    return json.loads(RECORDED_COSTS.read_text())


def record(kind: str, entry: dict, path: Path = RECORDED_COSTS) -> None:
    """`entry` (a measurement of the bench, kind 'cpu', or of gpu-check, kind 'gpu') replaces the recorded figures it
    measured (an arm's step ratio among the others); the rest stay."""
    from . import paths
    figures = json.loads(path.read_text())
    old = figures[kind]
    figures[kind] = {**old, **{k: {**old[k], **v} if isinstance(v, dict) and isinstance(old.get(k), dict) else v
                               for k, v in entry.items()}}
    paths.write_atomic(path, json.dumps(figures, indent=1, sort_keys=True) + "\n")
    recorded.cache_clear()


# The measures a verdict at equal compute can be read in: training FLOPs, or a device's measured step times.
COMPUTE_MEASURES = {"flops": "training FLOPs", "cpu": f"CPU step time ({recorded()['cpu']['machine']})",
                    "h100": f"{recorded()['gpu']['card']} step time (make gpu-check, {recorded()['gpu']['date']})"}
BYTES_PER_PARAM = 16          # fp32 weights and gradients, AdamW's two moments
TRAFFIC_TABLE = Path(__file__).with_name("traffic_table.json")


def training_flops(n_params: int, tokens: int) -> float:
    """Forward + backward FLOPs of training on `tokens` tokens: 6 N per token."""
    return 6.0 * n_params * tokens


def delta_flops_per_token(model) -> float:
    """The Delta update's own FLOPs a token, forward and backward (3x the forward), beyond its maps' matmuls (which 6N
    counts): per update the state's read k^T X (2 d d_v), the rank-1 write (2 d d_v) and, with d_v > 1, the
    compressor's taps over the state (2 K d d_v); two sublayers a layer, n_h updates each."""
    if model.residual == "baseline":
        return 0.0
    d, dv = model.d_model, model.dv
    per_update = 4 * d * dv + (2 * model.state_kernel * d * dv if dv > 1 else 0)
    return 3.0 * 2 * model.n_layer * model.n_h * per_update


def cost_ratio(model, baseline, n_params: int, base_params: int, measure: str) -> float | None:
    """A model's training cost a token over its baseline's, in a measure of COMPUTE_MEASURES; None where the measure
    has no figure for its arm (a step time the bench did not record)."""
    if measure == "flops":
        return ((training_flops(n_params, 1) + delta_flops_per_token(model))
                / (training_flops(base_params, 1) + delta_flops_per_token(baseline)))
    if model.residual == "baseline":
        return 1.0
    ratios = recorded()["cpu" if measure == "cpu" else "gpu"]["step_ratios"]
    return ratios.get(arm_key(model))


def arm_key(model) -> str:
    """What sets a model's traffic per layer and feature beside its size: its residual and Delta variant."""
    if model.residual == "baseline":
        return "baseline"
    return f"ddl dv={model.dv} conv={model.conv} mapping={model.mapping} n_h={model.n_h} beta={model.beta_estimator}"


@functools.cache
def traffic_table() -> dict:
    return json.loads(TRAFFIC_TABLE.read_text())


def traffic(model) -> tuple[str, dict]:
    """(the arm the table prices the model as, its entry): its own, else the plain variant of the nearest d_v."""
    arms = traffic_table()["arms"]
    key = arm_key(model)
    if key in arms:
        return key, arms[key]
    plain = {int(k.split()[1][3:]): k for k in arms if k.startswith("ddl ") and k.endswith("conv=none mapping=k n_h=1 "
                                                                                             "beta=linear")}
    nearest = plain[min(plain, key=lambda dv: abs(dv - model.dv))]
    return nearest, arms[nearest]


def measured_arm(model) -> str | None:
    """The arm of the model's d_v whose step ratio gpu-check measured, if any."""
    return next((key for key in recorded()["gpu"]["step_ratios"] if model.residual == "ddl"
                 and key.startswith(f"ddl dv={model.dv} ")), None)


def gpu_seconds_per_token(model, n_params: int, gpu: str = "H100") -> float:
    """One GPU's seconds a token: the baseline's at the recorded MFU times the arm's step ratio (module docstring)."""
    _, arm = traffic(model)
    figures = recorded()["gpu"]
    baseline = 6.0 * n_params / (BF16_PEAK_FLOPS[gpu] * figures["baseline_mfu"])
    ratio, extra = 1.0, arm["extra_bytes"]
    if measured_arm(model):
        ratio = figures["step_ratios"][measured_arm(model)]
        extra -= traffic_table()["arms"][measured_arm(model)]["extra_bytes"]
    return ratio * baseline + extra * model.n_layer * model.d_model / figures["copy_bytes_per_s"]


def gpu_hours(model, n_params: int, tokens: int, gpu: str = "H100") -> float:
    """GPU-hours to train on `tokens` tokens (all GPUs together: a job's wall time times its GPUs)."""
    return gpu_seconds_per_token(model, n_params, gpu) * tokens / 3600


def memory_per_gpu(model, n_params: int, tokens_per_micro_batch: int, checkpointing: bool = False,
                   graphs: bool = False) -> float:
    """Bytes one GPU holds at a step's peak: the parameters' state, and the activations saved for backward over a
    micro-batch times the recorded peak ratio: under CUDA graphs (graphs, train.compile_mode=reduce-overhead) the one
    measured in training runs with graphs, whose memory pool outlives each step, where gpu-check recorded one."""
    figures = recorded()["gpu"]
    ratio = figures.get("graphs_peak_over_saved") if graphs else None
    saved = saved_bytes_per_token(model, checkpointing) * tokens_per_micro_batch
    return BYTES_PER_PARAM * n_params + (ratio or figures["peak_over_saved"]) * saved


def saved_bytes_per_token(model, checkpointing: bool = False) -> float:
    """The activations autograd saves a token (ddl.traffic's table). Checkpointing per block keeps each block's input
    (the state, in bf16 with d_v > 1) and one block's activations at a time."""
    table = traffic_table()
    _, arm = traffic(model)
    per_layer = table["baseline_saved_per_layer_feature"] + arm["extra_saved"]        # bytes / token / feature
    vocab = table["baseline_saved_per_vocab"] * model.vocab_size
    if checkpointing:
        state = 2 * model.dv if model.residual == "ddl" and model.dv > 1 else 4
        return (model.n_layer * state + per_layer) * model.d_model + vocab
    return per_layer * model.n_layer * model.d_model + vocab
