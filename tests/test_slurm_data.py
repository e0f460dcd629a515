"""A sweep whose dataset is missing, on a real private SLURM cluster: one CPU-only prepare job first, the
training jobs submitted with --dependency=afterok on it; a prepare job killed mid-way, or failing, fails its
jobs with its line (cancelled, none left pending), and the sweep run again resumes the preparation."""

import contextlib
import json
import os
import re
import subprocess
import threading
import time

import psutil
import pytest

from ddl.data import DataConfig, prepare
from ddl.data.sources import units
from tests.conftest import VENV_BIN, mlflow_runs, run_cli
from tests.test_prepare import dataset_files, make_corpus
from tests.test_slurm import MICRO, SLURM

WIDE = {"COLUMNS": "400"}           # a summary's rows on one line each


@pytest.fixture
def slurm(system_slurm_decoys, slurm_cluster):
    return slurm_cluster


def _sweep(corpus: str, experiment: str) -> list[str]:
    return ["ddl-run", "-m", "residual=ddl,baseline", *MICRO, *SLURM, "data=files", f"data.files={corpus}",
            "data.bpe_vocab=512", f"experiment={experiment}"]


class QueueWatch(threading.Thread):
    """Every job the private cluster's queue shows while the sweep runs: its name, and the dependency
    `scontrol show job` gives it while it is pending."""

    def __init__(self):
        super().__init__(daemon=True)
        self.jobs: dict[str, dict] = {}
        self.stop = threading.Event()

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
            time.sleep(0.1)

    def prepare_jobs(self) -> list[str]:
        return [job_id for job_id, seen in list(self.jobs.items())      # a copy: the watch may be adding one
                if seen["name"].endswith("-prepare")]

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(10)


def _job_process(job_id: str) -> psutil.Process | None:
    """The job's Python process on its node (submitit's), once it started: not the `srun` whose command line
    names it too (a SIGKILL to srun ends the step only once slurmd notices, by which time the job may be done)."""
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmdline = process.info["cmdline"] or ()
            if "submitit.core._submit" in cmdline and os.path.basename(cmdline[0]).startswith("python") and \
                    process.environ().get("SLURM_JOB_ID") == job_id:
                return process
    return None


def _kill_mid_way(queue: QueueWatch, progress, last_unit: int, killed: list) -> None:
    """SIGKILL to the prepare job's process as soon as it recorded a position short of its last units, as the
    OOM killer or a failing node would (scancel would give it KillWait seconds, in which it may end): its
    process found first, then its record watched closely, so the kill lands mid-way on a quiet machine too."""
    process = None
    while not queue.stop.is_set():
        if process is None:
            process = _job_process(queue.prepare_jobs()[0]) if queue.prepare_jobs() else None
            time.sleep(0 if process else 0.2)
            continue
        with contextlib.suppress(OSError, ValueError):      # not written yet, or renamed away as it finished
            if json.loads(progress.read_text())["unit"] < last_unit - 4:
                process.kill()
                killed.append(queue.prepare_jobs()[0])
                return
        time.sleep(0.01)


def _fresh(corpus: str, tmp_path):
    return prepare(DataConfig(source="files", files=corpus, tokenizer="bpe", bpe_vocab=512), root=tmp_path / "fresh",
                   progress=False, workers=2)


@pytest.mark.slow
def test_a_sweep_whose_data_is_missing_waits_on_one_prepare_job_which_a_rerun_resumes_after_a_kill(
        slurm, ddl_home, tmp_path):
    """The dry run shows the prepare job; the sweep submits it first and its jobs with afterok on it; its process
    killed mid-way fails them with its line, none left pending, no run opened; the sweep run again submits one
    prepare job that resumes the build (the bytes of an uninterrupted one), and the jobs train after it."""
    corpus = make_corpus(tmp_path / "corpus", n_docs=1500)
    sweep = _sweep(corpus, "data_first")
    cfg = DataConfig(source="files", files=corpus, tokenizer="bpe", bpe_vocab=512)
    name, last_unit = cfg.dataset_name(), len(units(cfg))
    progress = ddl_home / "data" / f"{name}.partial" / "progress.json"

    dry = run_cli(*sweep, "--dry-run", env_extra=WIDE)
    assert dry.returncode == 0, dry.stderr
    [row] = [line for line in dry.stdout.splitlines() if f"prepare {name}" in line]
    assert "one CPU-only SLURM job, 1 CPU:" in row and "2 jobs wait on it" in row
    assert "--dependency=afterok" in " ".join(dry.stdout.split()) and not (ddl_home / "data").exists()

    killed: list = []
    with QueueWatch() as queue:
        killer = threading.Thread(target=_kill_mid_way, args=(queue, progress, last_unit, killed), daemon=True)
        killer.start()
        out = run_cli(*sweep, timeout=400, env_extra={**WIDE, "DDL_LOST_AFTER_S": "3"})
    said = out.stdout + out.stderr
    assert killed and out.returncode == 1, said[-4000:]
    line = (f"waiting on data (failed: prepare job {killed[0]} of {name} left the queue without a result (failed); "
            f"run the sweep again to resume it)")
    assert " ".join(out.stdout.split()).count(line) == 2, said[-4000:]        # each job's row, in the summary
    assert "0 finished, 0 skipped, 2 failed" in out.stdout
    assert subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip() == ""   # none left pending
    assert mlflow_runs("data_first") == [] and progress.is_file()

    with QueueWatch() as queue:
        again = run_cli(*sweep, timeout=400, env_extra=WIDE)
    said = again.stdout + again.stderr
    assert again.returncode == 0, said[-4000:]
    [prepare_id] = re.findall(r"SLURM job (\d+) prepares it", again.stdout)
    assert queue.prepare_jobs() == [prepare_id]
    training = {job_id: seen for job_id, seen in queue.jobs.items() if job_id != prepare_id}
    assert len(training) == 2 and all(seen["dependency"].startswith(f"afterok:{prepare_id}")
                                      for seen in training.values()), queue.jobs
    assert all(int(job_id) > int(prepare_id) for job_id in training)
    assert "waiting on data" in said and "2 finished, 0 skipped, 0 failed" in again.stdout
    [log] = [p for p in (ddl_home / "sweeps" / "data_first").rglob(f"{prepare_id}_0_log.err")]
    assert f"resuming {name} at document " in log.read_text()
    [built] = (ddl_home / "data").glob("files-bpe-*/")
    assert dataset_files(built) == dataset_files(_fresh(corpus, tmp_path))
    assert sorted(r.info.status for r in mlflow_runs("data_first")) == ["FINISHED", "FINISHED"]


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


def _queued(after: str) -> dict[str, tuple[str, str, str]]:
    """job id -> (name, state, reason) of the jobs submitted after job `after` that the queue still shows."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%r"], capture_output=True, text=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return {job_id: (name, state, reason) for job_id, name, state, reason in rows if int(job_id) > int(after)}


@pytest.mark.slow
def test_dependents_of_a_failed_prepare_end_with_no_launcher_alive_and_a_rerun_prepares_and_trains(
        slurm, ddl_home, tmp_path):
    """The prepare job at its defaults (32 CPUs, 64 GB: more than the private node has) is sized to the node and
    scheduled. The sweep's own process SIGKILLed while its jobs wait, the prepare job then failing (a file of the
    glob that is not UTF-8), SLURM ends the dependents itself (--kill-on-invalid-dep): none pends. The sweep run
    again, the file mended, prepares and trains."""
    from tests.test_slurm import SLURM
    corpus = tmp_path / "corpus"
    make_corpus(corpus, n_docs=100)
    defaults = [arg for arg in SLURM if not arg.startswith("hydra.launcher.prepare_")]
    sweep = ["ddl-run", "-m", "residual=ddl,baseline", *MICRO, *defaults, "data=files", f"data.files={corpus}/*.txt",
             "data.bpe_vocab=512", "experiment=orphans"]
    cpus = subprocess.run(["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True).stdout.split()[0]
    blocker = subprocess.run(["sbatch", "--parsable", "-c", cpus, "-o", "/dev/null", "--wrap", "sleep 600"],
                             capture_output=True, text=True, check=True).stdout.strip()   # the node busy: the prepare
    #                                                                                               job waits
    try:
        launcher = subprocess.Popen([str(VENV_BIN / "ddl-run"), *sweep[1:]], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env={**os.environ, **WIDE})
        deadline = time.monotonic() + 120
        while len(_queued(blocker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        launcher.kill()
        launcher.wait()
        queued = _queued(blocker)
        [prepare_id] = [job_id for job_id, (name, *_) in queued.items() if name.endswith("-prepare")]
        assert len(queued) == 3 and all(state == "PENDING" for _, state, _ in queued.values()), queued
        (corpus / "latin1.txt").write_bytes("Un café au lait. ".encode("latin-1") * 20)
    finally:
        subprocess.run(["scancel", blocker], check=True)
    deadline = time.monotonic() + 180
    while any(state in ("PENDING", "RUNNING") for _, state, _ in _queued(blocker).values()):
        assert time.monotonic() < deadline, _queued(blocker)
        time.sleep(0.5)
    ended = _queued(blocker)
    assert ended.pop(prepare_id)[1] == "FAILED"
    assert [state for _, state, _ in ended.values()] == ["CANCELLED", "CANCELLED"], ended   # by SLURM itself

    (corpus / "latin1.txt").unlink()
    again = run_cli(*sweep, timeout=400, env_extra=WIDE)
    said = again.stdout + again.stderr
    assert again.returncode == 0 and "2 finished, 0 skipped, 0 failed" in again.stdout, said[-4000:]
    assert f"prepare_cpus_per_task=32, prepare_mem_gb=64 lowered to {cpus} CPUs" in said


@pytest.mark.slow
def test_two_sweeps_sharing_a_home_submit_one_prepare_job(slurm, ddl_home, tmp_path):
    """Two sweeps (other experiments, one DDL_HOME, the lock file of a disk whose flock does not hold: DDL_LOCKS=file)
    find the dataset missing while the first one's prepare job waits for the busy node: the second's jobs depend on
    that job, no second one is submitted, and both sweeps train."""
    corpus = make_corpus(tmp_path / "corpus", n_docs=100)
    env = {**os.environ, **WIDE, "DDL_LOCKS": "file"}
    cpus = subprocess.run(["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True).stdout.split()[0]
    blocker = subprocess.run(["sbatch", "--parsable", "-c", cpus, "-o", "/dev/null", "--wrap", "sleep 600"],
                             capture_output=True, text=True, check=True).stdout.strip()
    sweeps = []
    try:
        for experiment, seed in (("first", 0), ("second", 1)):             # jobs of their own: other seeds
            sweeps.append(subprocess.Popen([str(VENV_BIN / "ddl-run"), *_sweep(corpus, experiment)[1:], f"seed={seed}"],
                                           env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            deadline = time.monotonic() + 120
            while len(_queued(blocker)) < 3 * len(sweeps) - (len(sweeps) - 1) and time.monotonic() < deadline:
                time.sleep(0.2)                                     # its prepare job (the first's) and two jobs
    finally:
        subprocess.run(["scancel", blocker], check=True)
    outs = [sweep.communicate(timeout=600)[0] for sweep in sweeps]
    assert [sweep.returncode for sweep in sweeps] == [0, 0], [out[-3000:] for out in outs]
    prepares = [job_id for job_id, (name, *_) in _queued(blocker).items() if name.endswith("-prepare")]
    assert len(prepares) == 1 and f"SLURM job {prepares[0]} prepares it" in outs[0]
    assert f"SLURM job {prepares[0]}, which another sweep on this DDL_HOME submitted, prepares it" in outs[1]
    assert all("2 finished, 0 skipped, 0 failed" in out for out in outs)
