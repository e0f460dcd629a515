"""The paper's cluster job, checked by SLURM itself: the sbatch script submitit writes for
`ddl-run -m +sweep=paper_small hydra/launcher=slurm`, given to `sbatch --test-only` on a private
cluster whose one node is shaped like a paper node (4 GPUs, 32 CPUs; the GPUs are GRES with
/dev/null as their device files, so nothing may run there, only be scheduled)."""

import os
import re
import socket
import subprocess

import pytest
import yaml

from tests.conftest import run_cli, slurm_down, slurm_up

GPU_NODE = {"DDL_SLURM_NODE_CPUS": "32", "DDL_SLURM_FAKE_GPUS": "4"}
PAPER_SMALL = ["+sweep=paper_small", "hydra/launcher=slurm", "hydra.launcher.partition=debug"]


@pytest.fixture(scope="module")
def gpu_node(system_slurm_decoys, tmp_path_factory):
    """A private cluster of one declared GPU node, for this module only."""
    cluster = slurm_up(tmp_path_factory.mktemp("slurm"), shape=GPU_NODE)
    try:
        yield cluster
    finally:
        slurm_down(cluster)


def job_script(overrides: list, ddl_home) -> str:
    """The sbatch script submitit would submit for these overrides: the launcher config as ddl-run's
    Hydra app composes it, the launcher and its submitit executor built from it as for a sweep."""
    from hydra.utils import instantiate

    from ddl.launch.submitit_private import slurm_script
    out = run_cli("ddl-run", *overrides, "--cfg", "all", "--resolve", env_extra={"DDL_HOME": str(ddl_home)})
    assert out.returncode == 0, out.stderr
    launcher = instantiate(yaml.safe_load(out.stdout)["hydra"]["launcher"])
    return slurm_script(launcher.executor())


def sbatch_test_only(cluster, script: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "job.sh"
    path.write_text(script)
    return subprocess.run(["sbatch", "--test-only", "--verbose", str(path)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "SLURM_CONF": str(cluster.conf)})


def parsed_options(stderr: str) -> dict:
    """sbatch --verbose's table of the options it read (the script's #SBATCH lines among them)."""
    table = stderr.split("defined options", 1)[1].split("end of defined options", 1)[0]
    return dict(re.findall(r"^sbatch: (\S+)\s+: (.*?)\s*$", table, flags=re.M))


def test_the_paper_small_job_script_is_accepted_by_sbatch(gpu_node, ddl_home, tmp_path):
    script = job_script(PAPER_SMALL, ddl_home)
    assert "\nsrun " in script and "-m submitit.core._submit" in script    # one srun: its tasks are the ranks
    out = sbatch_test_only(gpu_node, script, tmp_path)
    assert out.returncode == 0, out.stderr
    options = parsed_options(out.stderr)
    assert {k: options.get(k) for k in ("gpus-per-node", "ntasks-per-node", "cpus-per-task", "time", "partition")} \
        == {"gpus-per-node": "4", "ntasks-per-node": "4", "cpus-per-task": "8", "time": "3-00:00:00",
            "partition": "debug"}
    # The controller would start it: 4 tasks x 8 CPUs on the node, in the partition asked for.
    node = socket.gethostname().split(".")[0]
    assert re.search(rf"Job \d+ to start at \S+ using 32 processors on nodes {node} in partition debug", out.stderr)


@pytest.mark.parametrize("override, refusal", [
    ("hydra.launcher.gpus_per_node=5", "Requested node configuration is not available"),   # 5 tasks x 1 CPU fit
    ("hydra.launcher.partition=gpu", "invalid partition specified: gpu"),
])
def test_a_job_the_cluster_cannot_run_is_refused_by_sbatch(gpu_node, ddl_home, tmp_path, override, refusal):
    script = job_script([*PAPER_SMALL, "hydra.launcher.cpus_per_task=1", override], ddl_home)
    out = sbatch_test_only(gpu_node, script, tmp_path)
    assert out.returncode != 0 and refusal in out.stderr, out.stderr
