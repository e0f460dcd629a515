"""Every private name of submitit the project uses, and nothing else: an upgrade that moves one breaks this module
alone, and tests/test_private_apis.py says which name and which submitit version."""

from __future__ import annotations

CHECKED_WITH = "1.5.4"


def stop_waiting_for_results(job) -> None:
    """A job's results() polls 15 s for a result file a cluster's network filesystem may not show yet; a local
    job's process has exited, so its file is on this host's disk or never will be."""
    job._results_timeout_s = 0


def local_process(job):
    """The process submitit started for a local job (it runs the job's tasks); None for a cluster job."""
    return getattr(job, "_process", None)


def pin_local_gpus(executor, gpus: list[int]) -> None:
    """The GPUs (CUDA_VISIBLE_DEVICES) of the next local job an AutoExecutor submits: its local executor takes them,
    the AutoExecutor does not (without them each job gets GPUs 0..gpus_per_node-1)."""
    executor._executor.update_parameters(visible_gpus=gpus)


def slurm_script(executor) -> str:
    """The sbatch script an AutoExecutor on SLURM would submit, for a test to read."""
    slurm = executor._executor
    return slurm._make_submission_file_text(slurm._submitit_command_str, "script")
