"""A workstation's GPUs for the local launcher: which the machine has, and which each running job holds.

Jobs of `gpus_per_node` GPUs each run as many at once as the machine's GPUs hold (one DDP job over all of them when
`gpus_per_node` is their number), each pinned to its own through CUDA_VISIBLE_DEVICES; no GPU serves two jobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def machine_gpus() -> tuple[list[int], str]:
    """(the GPU indices jobs may use, where they come from): CUDA_VISIBLE_DEVICES where it is set (a shell or a
    scheduler's share of the machine), else the GPUs nvidia-smi lists, else none. Raises ValueError for a
    CUDA_VISIBLE_DEVICES of other than indices (the jobs' own are indices)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
        if not all(entry.isdigit() for entry in entries):
            raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r}: the local launcher pins jobs to GPUs by index; "
                             f"give indices (nvidia-smi -L lists them)")
        return [int(entry) for entry in entries], f"CUDA_VISIBLE_DEVICES={visible}"
    if shutil.which("nvidia-smi") is None:
        return [], "no nvidia-smi"
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    count = sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0
    return list(range(count)), "nvidia-smi -L"


class GpuSlots:
    """The machine's GPUs in groups of `per_job`, handed to jobs as they start and back as they end."""

    def __init__(self, gpus: list[int], per_job: int):
        self.groups = [tuple(gpus[i:i + per_job]) for i in range(0, len(gpus) - per_job + 1, per_job)]
        self.held: dict[str, tuple[int, ...]] = {}       # job signature -> its GPUs

    def take(self, signature: str, running: set[str]) -> tuple[int, ...]:
        """A free group for the job (those of jobs no longer `running` are free again)."""
        self.held = {sig: group for sig, group in self.held.items() if sig in running}
        group = next(group for group in self.groups if group not in self.held.values())
        self.held[signature] = group
        return group
