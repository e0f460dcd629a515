"""A sweep whose dataset is missing, on a real private SLURM cluster: one CPU-only prepare job first, the
training jobs submitted with --dependency=afterok on it; a prepare job killed mid-way, or failing, fails its
jobs with its line (cancelled, none left pending), and the sweep run again resumes the preparation."""

import contextlib
import json
import re
import subprocess
import threading
import time

import psutil
import pytest

from ddl.data import DataConfig, prepare
from ddl.data.sources import units
from tests.conftest import mlflow_runs, run_cli
from tests.test_prepare import dataset_files, make_corpus
from tests.test_slurm import MICRO, SLURM

PREPARE = ["hydra.launcher.prepare_cpus_per_task=2", "hydra.launcher.prepare_mem_gb=2",
           "hydra.launcher.prepare_timeout_min=20"]
WIDE = {"COLUMNS": "400"}           # a summary's rows on one line each


@pytest.fixture
def slurm(system_slurm_decoys, slurm_cluster):
    return slurm_cluster


def _sweep(corpus: str, experiment: str) -> list[str]:
    return ["ddl-run", "-m", "residual=ddl,baseline", *MICRO, *SLURM, *PREPARE, "data=files", f"data.files={corpus}",
            "data.bpe_vocab=512", f"experiment={experiment}"]


class QueueWatch(threading.Thread):
    """Every job the private cluster's queue shows while the sweep runs: its name, and the dependency
    `scontrol show job` gives it while it is pending."""

    def __init__(self, act=None):
        super().__init__(daemon=True)
        self.jobs: dict[str, dict] = {}
        self.act, self.stop = act, threading.Event()

    def run(self):
        while not self.stop.is_set():
            out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], capture_output=True, text=True).stdout
            for line in out.splitlines():
                job_id, name, state = line.split("|")
                seen = self.jobs.setdefault(job_id, {"name": name, "states": set(), "dependency": None})
                seen["states"].add(state)
                if state == "PENDING" and seen["dependency"] is None:
                    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
                    found = re.search(r"Dependency=(\S+)", shown)
                    seen["dependency"] = found and found.group(1)
            if self.act:
                self.act(self)
            time.sleep(0.1)

    def prepare_jobs(self) -> list[str]:
        return [job_id for job_id, seen in self.jobs.items() if seen["name"].endswith("-prepare")]

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(10)


def _kill_job_processes(job_id: str) -> None:
    """SIGKILL to the job's Python process on its node, as the OOM killer or a failing node would (scancel
    would give it KillWait seconds, in which a small preparation may end)."""
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if "submitit.core._submit" in (process.info["cmdline"] or ()) and \
                    process.environ().get("SLURM_JOB_ID") == job_id:
                process.kill()
                return
    raise AssertionError(f"no process of job {job_id} to kill")


def _fresh(corpus: str, tmp_path):
    return prepare(DataConfig(source="files", files=corpus, tokenizer="bpe", bpe_vocab=512), root=tmp_path / "fresh",
                   progress=False, workers=1)


@pytest.mark.slow
def test_a_sweep_whose_data_is_missing_prepares_it_in_one_cpu_job_its_jobs_depend_on(slurm, ddl_home, tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    sweep = _sweep(corpus, "data_first")
    dry = run_cli(*sweep, "--dry-run", env_extra=WIDE)
    assert dry.returncode == 0, dry.stderr
    [row] = [line for line in dry.stdout.splitlines() if "prepare files-bpe-" in line]
    assert "one CPU-only SLURM job, 2 CPUs:" in row and "2 jobs wait on it" in row
    assert "--dependency=afterok" in " ".join(dry.stdout.split()) and not (ddl_home / "data").exists()
    with QueueWatch() as queue:
        out = run_cli(*sweep, timeout=400, env_extra=WIDE)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-4000:]
    [prepare_id] = re.findall(r"SLURM job (\d+) prepares it", out.stdout)
    assert queue.prepare_jobs() == [prepare_id]
    training = {job_id: seen for job_id, seen in queue.jobs.items() if job_id != prepare_id}
    assert len(training) == 2 and all(seen["dependency"].startswith(f"afterok:{prepare_id}")
                                      for seen in training.values()), queue.jobs
    assert all(int(job_id) > int(prepare_id) for job_id in training)
    assert "waiting on data" in said and "2 finished, 0 skipped, 0 failed" in out.stdout
    assert sorted(r.info.status for r in mlflow_runs("data_first")) == ["FINISHED", "FINISHED"]
    [built] = (ddl_home / "data").glob("files-bpe-*/")
    assert dataset_files(built) == dataset_files(_fresh(corpus, tmp_path))


@pytest.mark.slow
def test_a_prepare_job_killed_mid_way_fails_its_jobs_and_the_sweep_run_again_resumes_it(slurm, ddl_home, tmp_path):
    corpus = make_corpus(tmp_path / "corpus", n_docs=5000)
    sweep = _sweep(corpus, "data_killed")
    cfg = DataConfig(source="files", files=corpus, tokenizer="bpe", bpe_vocab=512)
    name, last = cfg.dataset_name(), len(units(cfg))
    progress = ddl_home / "data" / f"{name}.partial" / "progress.json"
    killed: list = []

    def kill_once_it_recorded_its_position(queue):     # mid-way: not at the last units
        with contextlib.suppress(OSError, ValueError):    # (renamed away as it finished)
            if not killed and queue.prepare_jobs() and json.loads(progress.read_text())["unit"] < last - 4:
                killed.append(queue.prepare_jobs()[0])
                _kill_job_processes(killed[0])

    with QueueWatch(kill_once_it_recorded_its_position):
        out = run_cli(*sweep, timeout=400, env_extra={**WIDE, "DDL_LOST_AFTER_S": "3"})
    said = out.stdout + out.stderr
    assert killed and out.returncode == 1, said[-4000:]
    line = (f"waiting on data (failed: prepare job {killed[0]} of {name} left the queue without a result (failed); "
            f"run the sweep again to resume it)")
    assert " ".join(out.stdout.split()).count(line) == 2, said[-4000:]        # each job's row, in the summary
    assert "0 finished, 0 skipped, 2 failed" in out.stdout
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip() == ""   # none left pending
    assert mlflow_runs("data_killed") == [] and progress.is_file()
    again = run_cli(*sweep, timeout=400)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    [logs] = [p for p in (ddl_home / "sweeps" / "data_killed").rglob("*_0_log.err") if "resuming" in p.read_text()]
    assert f"resuming {name} at document " in logs.read_text()
    [built] = (ddl_home / "data").glob("files-bpe-*/")
    assert dataset_files(built) == dataset_files(_fresh(corpus, tmp_path))
    assert sorted(r.info.status for r in mlflow_runs("data_killed")) == ["FINISHED", "FINISHED"]


@pytest.mark.slow
def test_a_prepare_job_that_fails_fails_its_jobs_with_its_one_line(slurm, ddl_home, tmp_path):
    corpus = tmp_path / "corpus"
    make_corpus(corpus, n_docs=100)
    (corpus / "latin1.txt").write_bytes("Un café au lait. ".encode("latin-1") * 20)
    sweep = _sweep(str(corpus / "*.txt"), "data_failed")
    out = run_cli(*sweep, timeout=400, env_extra=WIDE)
    assert out.returncode == 1, (out.stdout + out.stderr)[-4000:]
    error = (f"data.files='{corpus}/*.txt': {corpus / 'latin1.txt'}: not utf-8 at byte 6 (0xe9); set "
             f"data.encoding=<the files' encoding>")
    shown = " ".join(out.stdout.split())
    assert shown.count(f"waiting on data (failed: {error}") == 2, out.stdout[-4000:]
    assert error in out.stderr                                   # the prepare's line, once, as it ends
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip() == ""
    assert mlflow_runs("data_failed") == []
