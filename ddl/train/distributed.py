"""The process's share of the machine: torch.distributed from the environment torchrun or the
launcher (from submitit) provides, its CPU threads, and how its host memory is reused."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..cpus import cpu_threads as cpu_threads   # the trainer's torch threads (ddl.cpus)


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
    if device_type == "cuda":  # before NCCL starts: else every rank's communicator sits on GPU 0
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=info.rank, world_size=world_size)
    return info


def all_reduce_mean(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.world_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        values /= info.world_size
    return values


def any_rank_signal(received: int | None, info: DistInfo, device: torch.device) -> int | None:
    """The signal some rank received by this step boundary (the highest number), or None: ranks
    that stopped at different steps would leave the others waiting in the next all-reduce."""
    if info.world_size == 1:
        return received
    flag = torch.tensor(received or 0, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) or None


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse instead of handing it back to the OS.

    PyTorch's CPU tensors come from malloc. With glibc's defaults a tensor of a few MiB is
    mmapped, or trimmed off the heap when freed, so every training step page-faults its
    activations in afresh: about 10k faults a step at the bench's d_v=4 config, a tenth of its
    step time on a VM. With the mmap threshold at its maximum and no trimming below 2 GiB, the
    heap keeps its peak and each step reuses it. Returns False where the C library is not glibc.
    """
    process = ctypes.CDLL(None)                      # the symbols this process has loaded, libc's among them
    if not hasattr(process, "gnu_get_libc_version"):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(process.mallopt(M_MMAP_THRESHOLD, 32 << 20) and process.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))
