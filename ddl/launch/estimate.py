"""What the dry run says a job costs: GPU-hours on an H100 and memory per GPU, and core-seconds where it trains on CPU.

GPU: ddl.costs (the baseline's measured MFU plus the arm's counted memory traffic; the activations it saves). CPU:
6·N·D FLOPs at a throughput measured on this project's reference CPU (below), plus the job's fixed costs; a sweep's
wall time is its jobs scheduled longest first on the launcher's parallel slots.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass

from ..costs import gpu_hours, memory_per_gpu, training_flops
from ..model.config import param_count

# Measured on the 2-vCPU AMD EPYC VM the project runs on (torch 2.13.0+cpu), at one thread, while
# other jobs shared it (load average 5-9; per-token CPU time is likely pessimistic):
# - `ddl-run model=tiny data=python_source residual=baseline` (train=cpu: 1024 tokens a step,
#   T=128), process CPU time (user + sys) of a 230-step run minus a 30-step one: 1.63e-4 core-s a
#   token, 6·N = 4.9 MFLOP a token;
# - the arms against it, training steps in one process (time.process_time, two rounds): d_v=1
#   1.02-1.16x, the d_v=4 rows (none, CC, EC, CC-EC) 1.07-1.43x.
CPU_TRAIN_FLOPS = 3.0e10         # 6·N FLOPs per token per core-second, the baseline
CPU_ARM_FACTOR = {"baseline": 1.0, "dv1": 1.1, "expanded": 1.3}   # core-seconds per token against the baseline
CPU_JOB_SECONDS = 12.0           # per job: start-up (imports, data, MLflow run) and the final save
CPU_EVAL_SECONDS = 15.0          # per evaluation (task@shots) of the offline task, lm-eval included


# Data preparation, `python -m ddl.data.bench` on the 2-vCPU VM (docs/performance.md, "Preparing the data"): the
# tokens a worker writes per CPU-second, per tokenizer (gpt2: tiktoken with GPT-2's pattern and a 50,257-token
# table trained there, GPT-2's own file being out of reach); the parent's pace, which caps the workers' sum; and
# the UTF-8 bytes a token held in the bench's English text (bpe: the 4,096-token default; gpt2: the stand-in's).
PREPARE_TOKENS_PER_CORE_S = {"byte": 40e6, "bpe": 850e3, "gpt2": 1.9e6}
PREPARE_PARENT_TOKENS_S = 50e6
TEXT_BYTES_PER_TOKEN = {"byte": 1.0, "bpe": 2.7, "gpt2": 3.4}


def prepare_seconds(data, cpus: int) -> tuple[float, float]:
    """(tokens, wall seconds) to prepare the dataset on `cpus` workers: its token budget, or its text's bytes
    over a token's; at the measured tokens/s of a worker times the workers, at most the parent's pace."""
    if data.source == "fineweb_edu":
        tokens = float(data.fineweb_tokens)
    else:
        from ..data.sources import units
        tokens = sum(unit.size for unit in units(data)) / TEXT_BYTES_PER_TOKEN[data.tokenizer]
    return tokens, tokens / min(PREPARE_TOKENS_PER_CORE_S[data.tokenizer] * max(1, cpus), PREPARE_PARENT_TOKENS_S)


@dataclass(frozen=True)
class Cost:
    params: int
    tokens: int
    gpu_hours: float                   # on an H100
    gpu_memory: float                  # bytes per GPU at a step's peak
    cpu_seconds: float | None = None   # jobs that train on CPU: core-seconds
    graphs: bool = False               # trains under CUDA graphs (train.compile_mode=reduce-overhead)


def _arm(model) -> str:
    return "baseline" if model.residual == "baseline" else "dv1" if model.dv == 1 else "expanded"


def job_cost(job, gpus: int) -> Cost:
    """The job's cost with `gpus` GPUs per job (0: it trains on CPU, as the local launcher's jobs do)."""
    run = job.run
    n_params, tokens = param_count(run.model), run.train.steps * run.train.batch_tokens
    on_gpu = gpu_hours(run.model, n_params, tokens)
    graphs = run.train.compile and run.train.compile_mode == "reduce-overhead"
    memory = memory_per_gpu(run.model, n_params, run.train.micro_batch * run.train.seq_len,
                            run.train.activation_checkpointing, graphs)
    if gpus and run.train.device != "cpu":
        return Cost(n_params, tokens, on_gpu, memory, graphs=graphs)
    validations = run.train.steps // run.train.eval_every + 1
    flops = training_flops(n_params, tokens) + training_flops(n_params, validations * run.train.eval_tokens) / 3
    seconds = flops / CPU_TRAIN_FLOPS * CPU_ARM_FACTOR[_arm(run.model)]   # a forward pass is a third of a step
    fixed = CPU_JOB_SECONDS + CPU_EVAL_SECONDS * len(job.evaluation.evaluations())
    return Cost(n_params, tokens, on_gpu, memory, seconds + fixed)


def with_micro_batch(job, micro_batch: int):
    """The job as it would be with another micro-batch (for the plan's what-if; its signature is not recomputed)."""
    train = dataclasses.replace(job.run.train, micro_batch=micro_batch)
    return dataclasses.replace(job, run=dataclasses.replace(job.run, train=train))


def wall_seconds(core_seconds: list[float], slots: int, threads: int) -> float:
    """Jobs started longest first on `slots` parallel slots of `threads` threads each (assumed to
    scale linearly): when the last one ends."""
    ends = [0.0] * max(1, slots)
    for seconds in sorted(core_seconds, reverse=True):
        heapq.heappush(ends, heapq.heappop(ends) + seconds / max(1, threads))
    return max(ends)
