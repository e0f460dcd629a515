"""torch.distributed from the environment torchrun or the launcher (from submitit) provides."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group described by RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT.

    A no-op for a single process. NCCL on GPU, gloo on CPU.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), world_size)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=info.rank, world_size=world_size)
    return info


def all_reduce_mean(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        values /= info.world_size
    return values


def cpu_threads() -> int:
    """CPUs this process may use: the launcher's DDL_CPUS, SLURM's allocation, or the affinity mask."""
    for var in ("DDL_CPUS", "SLURM_CPUS_PER_TASK"):
        if os.environ.get(var):
            return max(1, int(os.environ[var]))
    return max(1, len(os.sched_getaffinity(0)))
