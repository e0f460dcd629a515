"""A job over two nodes: scripts/slurm-local's two-node cluster (a slurmd each, on this host), a DDP job of
`hydra.launcher.nodes=2` against one node's two tasks."""

import threading

import pytest

from tests.conftest import mlflow_runs, run_cli, slurm_down, slurm_up
from tests.test_slurm import MICRO, SLURM, _requeue_when_running

TRAIN = ["train.steps=120", "train.eval_every=40", "train.ckpt_every=1000", "train.log_every=5",
         "train.batch_tokens=4096", "train.micro_batch=16", "train.seq_len=128"]     # > KillWait after step 40


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Two nodes of 2 declared CPUs each, so one node also takes a job of two 1-CPU tasks."""
    cluster = slurm_up(tmp_path_factory.mktemp("slurm2"), {"DDL_SLURM_NODES": "2", "DDL_SLURM_NODE_CPUS": "2"})
    yield cluster
    slurm_down(cluster)


def _history(run, key: str) -> dict[int, float]:
    from ddl.track import store
    points = store.client().get_metric_history(run.info.run_id, key)
    assert len({p.step for p in points}) == len(points), f"{key}: a step logged twice"
    return {p.step: p.value for p in points}


@pytest.mark.slow
def test_a_two_node_job_is_one_gloo_group_that_resumes_from_a_requeue_with_one_nodes_losses(
        two_nodes, ddl_home, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(two_nodes.conf))
    one_node = run_cli("ddl-run", "-m", *MICRO, *TRAIN, *SLURM, "hydra.launcher.tasks_per_node=2",
                       "experiment=one_node", timeout=600)
    assert one_node.returncode == 0, one_node.stdout[-3000:] + one_node.stderr[-3000:]
    [reference] = mlflow_runs("one_node")
    expected = {key: _history(reference, key) for key in ("train/loss", "val/loss")}

    monkeypatch.setenv("DDL_HOME", str(tmp_path / "two_nodes"))
    requeued: list = []
    watcher = threading.Thread(target=_requeue_when_running, args=(tmp_path / "two_nodes", 40, requeued))
    watcher.start()
    out = run_cli("ddl-run", "-m", *MICRO, *TRAIN, *SLURM, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1",
                  "experiment=two_nodes", timeout=600)
    watcher.join()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert requeued, "the job finished before it could be requeued"
    [run] = mlflow_runs("two_nodes")
    assert run.info.status == "FINISHED" and run.data.tags.get("ddl.resumed") == "true"
    job_dir = next((tmp_path / "two_nodes" / "sweeps").rglob(f".submitit/{run.data.tags['ddl.slurm_job_id']}"))
    for rank in (0, 1):                   # each task on its own node, both in one group, before and after the requeue
        log = (job_dir / f"{job_dir.name}_{rank}_log.out").read_text()
        assert log.count(f"node={rank}(2), global_rank={rank}(2)") == 2, log[-2000:]
        assert log.count(f"rank {rank}/2: joined the gloo process group") == 2, log[-2000:]
    assert {key: _history(run, key) for key in expected} == expected
