"""The suite's SLURM cluster is private: its own conf, ports, ClusterName and daemons; a system
SLURM (here a decoy /etc/slurm/slurm.conf and a process named slurmd) is neither read, written nor
signalled, by the SLURM tests (test_slurm.py runs before this file) nor by `slurm-local down`."""

import os
import re
import socket
import subprocess
import time
from pathlib import Path

from tests.conftest import slurm_down, slurm_up


def _slurm(cluster, *args: str, **kw) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SLURM_CONF": str(cluster.conf)}, **kw)
    assert out.returncode == 0, f"{args[0]}: {out.stderr.strip()}"
    return out.stdout


def _config(cluster) -> dict:
    """slurmctld's running configuration (`scontrol show config` asks the controller)."""
    lines = _slurm(cluster, "scontrol", "show", "config").splitlines()
    return {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in lines) if v}


def _conf_value(conf: Path, key: str) -> str:
    return next(line.split("=", 1)[1] for line in conf.read_text().splitlines() if line.startswith(key + "="))


def _ports(conf: Path) -> set[str]:
    """slurmctld's port and each node's slurmd's."""
    return {_conf_value(conf, "SlurmctldPort"), *re.findall(r"^NodeName=.* Port=(\d+)", conf.read_text(), re.M)}


def _job_prints_its_cluster(cluster, out_dir: Path) -> str:
    """A one-line batch job's output; polled (sbatch --wait polls at 2-10 s)."""
    out = out_dir / "job.out"
    job_id = _slurm(cluster, "sbatch", "--parsable", "-o", str(out), "--wrap", "echo $SLURM_CLUSTER_NAME").strip()
    deadline = time.time() + 300
    while _slurm(cluster, "squeue", "-h", "-j", job_id, "-o", "%T").strip() and time.time() < deadline:
        time.sleep(0.2)
    return out.read_text().strip()


def test_the_private_cluster_leaves_a_system_slurm_alone(system_slurm_decoys, slurm_cluster, tmp_path_factory):
    assert not system_slurm_decoys.disturbed()                        # after test_slurm.py's sweeps, if it ran
    # The suite's cluster answers from its own conf: its ClusterName, ports, node; a job runs there.
    config = _config(slurm_cluster)
    assert config["ClusterName"] == "ddl-private" and config["SLURM_CONF"] == str(slurm_cluster.conf)
    assert config["SlurmctldPort"] == _conf_value(slurm_cluster.conf, "SlurmctldPort")
    assert _slurm(slurm_cluster, "sinfo", "-h", "-o", "%N %T").split() == [socket.gethostname().split(".")[0], "idle"]
    assert _job_prints_its_cluster(slurm_cluster, tmp_path_factory.mktemp("job")) == "ddl-private"

    # A second private cluster beside it (own ports and munged): up, a job, down by its PID files.
    other = slurm_up(tmp_path_factory.mktemp("slurm"))
    try:
        assert len(_ports(other.conf)) == 2 and _ports(other.conf).isdisjoint(_ports(slurm_cluster.conf))
        assert _job_prints_its_cluster(other, tmp_path_factory.mktemp("job")) == "ddl-private"
    finally:
        down = slurm_down(other)                                      # asserts its processes are gone
    assert "stopped slurmd-" in down.stdout and not list(other.dir.glob("*.pid"))

    assert not system_slurm_decoys.disturbed()
    assert len(slurm_cluster.alive()) == len(slurm_cluster.pids)      # the suite's cluster is still up
    assert _slurm(slurm_cluster, "sinfo", "-h", "-o", "%T").split() == ["idle"]
