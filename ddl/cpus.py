"""How many CPUs this process may use: torch's threads in a run, the workers of a data preparation."""

from __future__ import annotations

import os


def cpu_threads() -> int:
    """CPUs this process may use: the launcher's DDL_CPUS, SLURM's allocation, or the affinity mask."""
    for var in ("DDL_CPUS", "SLURM_CPUS_PER_TASK"):
        if os.environ.get(var):
            return max(1, int(os.environ[var]))
    return max(1, len(os.sched_getaffinity(0)))
