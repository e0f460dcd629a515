"""A run folder's journal (ddl.track.journal) and `ddl-track sync`, which rebuilds a store from the folders."""

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ddl.track import journal as journal_module
from ddl.track import sync
from ddl.text import plural
from ddl.track.journal import Journal, JournalDamaged
from tests.conftest import run_cli


def _write_run(journal: Journal, uid: str = "a" * 32, steps: int = 3) -> None:
    """A run's writes as a job makes them: opened, params and tags, curves, a deleted tag, finished."""
    journal.append("run", uid, experiment="exp", name="ddl_dv1-micro-s0", start_time=1000, home="h1")
    journal.append("params", uid, params={"model.dv": "1", "train.steps": str(steps)})
    journal.append("tags", uid, tags={"ddl.signature": "sig", "ddl.error": "stale"})
    journal.append("delete_tag", uid, key="ddl.error")
    for step in range(1, steps + 1):
        journal.append("metrics", uid, points=[["train/loss", 5.0 / step, 2000 + step, step],
                                               ["train/lr", 1e-3, 2000 + step, step]])
    journal.append("status", uid, status="FINISHED", end_time=9000)


def test_records_fold_into_run_history(tmp_path):
    journal = Journal(tmp_path / "runs" / "sig")        # the folder does not exist yet
    _write_run(journal)
    journal.append("metrics", "a" * 32, points=[["train/loss", 5.0, 2001, 1], ["val/loss", math.nan, 2003, 3]])
    journal.append("artifact", "a" * 32, path="config.yaml", file="old.yaml", sha256="0" * 64, size=1)
    journal.append("artifact", "a" * 32, path="config.yaml", file="config.yaml", sha256="1" * 64, size=2)
    journal.append("dataset", "a" * 32, name="tiny", digest="d1", source="{}", source_type="local",
                   profile="{}", context="training")
    journal.sync()
    (history,) = journal.runs().values()
    assert (history.experiment, history.name, history.start_time) == ("exp", "ddl_dv1-micro-s0", 1000)
    assert history.params == {"model.dv": "1", "train.steps": "3"}
    assert history.tags == {"ddl.signature": "sig"}
    assert [p for p in history.points if p[0] == "train/loss"] == [("train/loss", 5.0 / s, 2000 + s, s)
                                                                   for s in (1, 2, 3)]   # a repeat is one point
    assert [p[0] for p in history.points].count("val/loss") == 1 and math.isnan(history.points[-1][1])
    assert history.artifacts == {"config.yaml": {"file": "config.yaml", "sha256": "1" * 64, "size": 2}}
    assert [d["name"] for d in history.datasets] == ["tiny"]
    assert (history.status, history.end_time, history.deleted) == ("FINISHED", 9000, False)
    line = json.loads(journal.path.read_text().splitlines()[0])
    assert list(line)[:3] == ["kind", "run", "t"] and list(line)[-1] == "sha" and len(line["sha"]) == 16


def test_runs_in_order_of_first_appearance_and_deleted(tmp_path):
    journal = Journal(tmp_path)
    _write_run(journal, "b" * 32)
    _write_run(journal, "a" * 32)
    journal.append("deleted", "b" * 32)
    assert [(uid, h.deleted) for uid, h in journal.runs().items()] == [("b" * 32, True), ("a" * 32, False)]


def test_torn_last_line_is_ignored_and_a_later_append_is_read(tmp_path):
    journal = Journal(tmp_path)
    _write_run(journal)
    whole = journal.records()
    with open(journal.path, "ab") as f:
        f.write(b'{"kind":"metrics","run":"' + b"a" * 32 + b'","t":1,"points":[["train/lo')   # a crash mid-append
    assert journal.records() == whole and journal.torn
    journal.append("status", "a" * 32, status="KILLED", end_time=None)   # the job resumed after the crash
    assert journal.records()[:-1] == whole and journal.records()[-1]["status"] == "KILLED" and not journal.torn
    assert journal.runs()["a" * 32].status == "KILLED"


@pytest.mark.parametrize("damage, what", [
    (lambda line: line.replace(b"5.0", b"6.0"), "checksum"),
    (lambda line: line[:-10], "not a JSON record"),
    (lambda line: b"\x00" * len(line), "not a JSON record"),
])
def test_damaged_middle_line_names_file_and_line(tmp_path, damage, what):
    journal = Journal(tmp_path)
    _write_run(journal)
    lines = journal.path.read_bytes().split(b"\n")
    lines[4] = damage(lines[4])                           # the first metrics record
    journal.path.write_bytes(b"\n".join(lines))
    with pytest.raises(JournalDamaged) as err:
        journal.records()
    message = str(err.value)
    assert message.startswith(f"{journal.path}:5: ") and what in message and "\n" not in message


def test_unknown_kind_or_missing_field_is_refused_on_append_and_on_read(tmp_path):
    journal = Journal(tmp_path)
    with pytest.raises(ValueError, match="kind='metric'"):
        journal.append("metric", "a" * 32, points=[])
    for record in ({"kind": "metric", "run": "a" * 32, "t": 1}, {"kind": "metrics", "run": "a" * 32, "t": 1}):
        line = json.dumps({**record, "sha": journal_module._digest(record)}, separators=(",", ":"))
        journal.path.write_text(line + "\n")                  # whole and checksummed, but not a record we know
        with pytest.raises(JournalDamaged, match=r":1: record kind='metric' is unknown|:1: .* lacks points"):
            journal.records()


def test_two_processes_appending_keep_whole_lines(tmp_path):
    """Concurrent appenders (an O_APPEND write per record) never interleave within a line."""
    code = ("import sys; from pathlib import Path; from ddl.track.journal import Journal\n"
            "j = Journal(Path(sys.argv[1]))\n"
            "for i in range(300): j.append('metrics', sys.argv[2], points=[['k', float(i), i, i]] * 50)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), uid]) for uid in ("x" * 32, "y" * 32)]
    assert [p.wait() for p in procs] == [0, 0]
    runs = Journal(tmp_path).runs()
    assert sorted(runs) == ["x" * 32, "y" * 32] and all(len(h.points) == 300 for h in runs.values())
    assert os.path.getsize(Journal(tmp_path).path) > 600 * 50 * 10


# ddl-track sync: journals written as a run writes them, synced into real stores.

def _journal_a_run(home, signature: str, uid: str, shift: float = 0.0, status: str = "FINISHED",
                   experiment: str = "sync"):
    """A run folder as a job leaves it: the run opened (params, tags), curves in batches (one point sent
    twice, a NaN), a summary at step 0, its dataset, artifacts kept in the folder (a config, a checkpoint
    logged under another name), a stale tag deleted, the run ended. Returns its Journal."""
    run_dir = home / "runs" / signature
    journal = Journal(run_dir)
    journal.append("run", uid, experiment=experiment, name=f"{signature}-s0", start_time=1_700_000_000_000, home="h1")
    journal.append("tags", uid, tags={"ddl.signature": signature, "ddl.sweep": "sync", "ddl.error": "stale"})
    journal.append("params", uid, params={"model.dv": "1", "train.steps": "4", "train.seed": "0"})
    for first in (1, 3):
        journal.append("metrics", uid, points=[[key, 5.0 / step + shift + i, 1_700_000_001_000 + step, step]
                                               for step in (first, first + 1)
                                               for i, key in enumerate(("train/loss", "val/loss"))])
    journal.append("metrics", uid, points=[["train/loss", 1.25 + shift, 1_700_000_001_004, 4],   # sent again
                                           ["beta/L00.attn", math.nan, 1_700_000_001_004, 4]])
    journal.append("dataset", uid, name="tiny", digest="d1", source='{"uri": "tiny"}', source_type="local",
                   profile='{"tokens": 100}', context="training")
    for artifact, file, body in (("config.yaml", f"artifacts/{uid}/config.yaml", b"model: micro\n"),
                                 ("checkpoint/model.pt", "checkpoints/step_4.pt", os.urandom(3000))):
        (run_dir / file).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / file).write_bytes(body)
        journal.append("artifact", uid, path=artifact, file=file, sha256=journal_module.file_sha256(run_dir / file),
                       size=len(body))
    journal.append("delete_tag", uid, key="ddl.error")
    journal.append("metrics", uid, points=[["final/val_loss", 1.25 + shift, 1_700_000_002_000, 0]])
    journal.append("status", uid, status=status, end_time=1_700_000_003_000)
    return journal


def _as_stored(value):
    return "nan" if math.isnan(value) else value


def _assert_holds(client, run, history):
    """The store's run holds everything the journal's run does: name, times, params, tags, every point
    (once), the dataset, each artifact's bytes."""
    info = run.info
    assert (client.get_experiment(info.experiment_id).name, info.run_name, info.start_time, info.status,
            info.end_time) == (history.experiment, history.name, history.start_time, history.status, history.end_time)
    assert run.data.params == history.params
    assert history.tags.items() <= run.data.tags.items() and "ddl.error" not in run.data.tags
    held = sorted((m.key, m.step, m.timestamp, _as_stored(m.value)) for key in run.data.metrics
                  for m in client.get_metric_history(info.run_id, key))
    assert held == sorted((k, s, t, _as_stored(v)) for k, v, t, s in history.points)
    assert [(d.dataset.name, d.dataset.digest) for d in run.inputs.dataset_inputs] == [("tiny", "d1")]
    for path, artifact in history.artifacts.items():
        local = client.download_artifacts(info.run_id, path, str(Path(tempfile.mkdtemp())))
        assert journal_module.file_sha256(Path(local)) == artifact["sha256"], path


def _runs_by_origin(client, experiment="sync"):
    """The experiment's active runs, by the journal uid they rebuild (their own id where they are the original)."""
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return {run.data.tags.get(sync.ORIGIN_TAG, run.info.run_id): run for run in runs}


@pytest.mark.slow
def test_sync_rebuilds_an_empty_store_and_a_second_sync_adds_nothing(ddl_home):
    first = _journal_a_run(ddl_home, "sig1", "1" * 32)
    first.append("deleted", "1" * 32)                      # replaced: a deleted run is not brought back
    _journal_a_run(ddl_home, "sig1", "2" * 32, shift=0.5)
    _journal_a_run(ddl_home, "sig2", "3" * 32, shift=1.0, status="KILLED")
    synced = run_cli("ddl-track", "sync")
    assert synced.returncode == 0, synced.stderr
    assert synced.stdout.strip().splitlines()[-1] == (
        f"ddl-track sync: 2 journals into sqlite:///{ddl_home / 'mlflow.db'}: 2 runs created, 0 updated, "
        f"0 up to date, 0 conflicts, 1 skipped; 20 points and 4 artifacts added")
    from ddl.track import store
    client = store.client()
    runs = _runs_by_origin(client)
    assert sorted(runs) == ["2" * 32, "3" * 32]
    for signature, uid in (("sig1", "2" * 32), ("sig2", "3" * 32)):
        _assert_holds(client, runs[uid], Journal(ddl_home / "runs" / signature).runs()[uid])
    again = run_cli("ddl-track", "sync")
    assert again.returncode == 0 and again.stdout.strip().endswith(
        "0 runs created, 0 updated, 2 up to date, 0 conflicts, 1 skipped; nothing added"), again.stdout
    assert sorted(_runs_by_origin(client)) == ["2" * 32, "3" * 32]


def _store_run_with_part_of_its_journal(home, uid_points=2):
    """A run the store holds (the journal's uid is its run id), which lost the writes after its first points."""
    from mlflow.entities import Metric
    from ddl.track import store
    client = store.client()
    run = client.create_run(store.experiment_id("sync"), start_time=1_700_000_000_000, run_name="sig1-s0")
    journal = _journal_a_run(home, "sig1", run.info.run_id)
    history = journal.runs()[run.info.run_id]
    client.log_batch(run.info.run_id, metrics=[Metric(k, v, t, s) for k, v, t, s in history.points[:uid_points]])
    return client, run.info.run_id, journal


def test_sync_adds_only_what_a_run_in_the_store_lacks(ddl_home):
    client, run_id, journal = _store_run_with_part_of_its_journal(ddl_home)
    report = sync.sync_home(ddl_home / "runs", store_uri(ddl_home))
    assert (dict(report.states), report.points, report.artifacts, report.problems) == ({"updated": 1}, 8, 2, [])
    run = client.get_run(run_id)
    assert sync.ORIGIN_TAG not in run.data.tags                  # found by its own id, not rebuilt
    _assert_holds(client, run, journal.runs()[run_id])
    assert sync.sync_home(ddl_home / "runs", store_uri(ddl_home)).summary().endswith("1 up to date, 0 conflicts; "
                                                                                     "nothing added")


def store_uri(home):
    return f"sqlite:///{home / 'mlflow.db'}"


def test_a_sqlite_store_elsewhere_keeps_the_artifacts_beside_it_not_in_the_working_directory(
        ddl_home, tmp_path, monkeypatch):
    """MLflow's default for a new experiment in an SQLite store is ./mlruns of the calling process: a sync to a
    lab's store file left checkpoints wherever it was started."""
    from mlflow.tracking import MlflowClient
    _journal_a_run(ddl_home, "sig1", "1" * 32)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    uri = store_uri(tmp_path / "lab")
    assert sync.sync_home(ddl_home / "runs", uri).artifacts == 2
    experiment = MlflowClient(uri).get_experiment_by_name("sync")
    assert experiment.artifact_location == (tmp_path / "lab" / "mlartifacts" / "sync").as_uri()
    assert len(list((tmp_path / "lab" / "mlartifacts" / "sync").rglob("model.pt"))) == 1
    assert not list((tmp_path / "cwd").iterdir())


@pytest.mark.parametrize("differs", ["param", "point"])
def test_a_run_held_with_other_numbers_is_one_line_and_left_untouched(ddl_home, capsys, differs):
    client, run_id, journal = _store_run_with_part_of_its_journal(ddl_home, uid_points=0)
    if differs == "param":
        client.log_param(run_id, "model.dv", "4")
    else:
        client.log_metric(run_id, "train/loss", 3.0, timestamp=1, step=2)
    before = client.get_run(run_id)
    _journal_a_run(ddl_home, "sig2", "3" * 32)                       # another folder: synced all the same
    capsys.readouterr()
    assert sync.main(["sync"]) == 1
    out, err = capsys.readouterr()
    what = ("param model.dv is '1' in the journal, '4' there" if differs == "param"
            else "metric train/loss at step 2 is 2.5 in the journal, 3.0 there")
    assert err.splitlines() == [f"ddl-track: conflict: {journal.path} run {run_id} and {store_uri(ddl_home)} run "
                                f"{run_id}: {what}; that run is left as it is"]
    assert out.strip().endswith("1 run created, 0 updated, 0 up to date, 1 conflict; 10 points and 2 artifacts added")
    after = client.get_run(run_id)
    assert (after.data.to_dictionary(), after.info.status, client.list_artifacts(run_id)) == (
        before.data.to_dictionary(), "RUNNING", [])


def test_a_damaged_journal_is_one_line_and_the_others_sync(ddl_home, capsys):
    damaged = _journal_a_run(ddl_home, "sig1", "1" * 32)
    lines = damaged.path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"5.0", b"5.5")                       # a changed number in the first curve batch
    damaged_sha = json.loads(lines[3])["sha"]
    damaged.path.write_bytes(b"\n".join(lines))
    torn = _journal_a_run(ddl_home, "sig2", "2" * 32)
    with open(torn.path, "ab") as f:
        f.write(b'{"kind":"metrics","run":"' + b"2" * 32 + b'","t":1,"points":[["train/lo')
    assert sync.main(["sync"]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"ddl-track: {damaged.path}:4: checksum {damaged_sha!r} does not match the line "
                                f"(changed after it was written); its runs are not synced"]
    assert out.strip().endswith("1 run created, 0 updated, 0 up to date, 0 conflicts; "
                                                      "10 points and 2 artifacts added")


def test_a_run_whose_journal_ends_in_a_torn_record_is_said_to_stay_running(ddl_home, capsys):
    """A crash while the run's end was appended: the rebuilt run is RUNNING, and the sync says which one, why and
    what ends it, in one line, each time, and counts it; a run whose end is in its journal is not named."""
    torn = _journal_a_run(ddl_home, "sig1", "1" * 32)
    whole = torn.path.read_bytes()
    torn.path.write_bytes(whole[:whole.rindex(b"\n", 0, -1) + 40])          # the status record, cut short
    _journal_a_run(ddl_home, "sig2", "2" * 32)
    from ddl.track import store
    for created, up_to_date in ((2, 0), (0, 2)):
        assert sync.main(["sync"]) == 0
        out, err = capsys.readouterr()
        run = _runs_by_origin(store.client())["1" * 32]
        assert run.info.status == "RUNNING" and not err
        assert out.splitlines()[:-1] == [
            f"ddl-track sync: sig1-s0 [sig1]: MLflow run {run.info.run_id} stays RUNNING: the journal's last record "
            f"is torn (a crash mid-write), the run's end with it if it had one; running its job again resumes and "
            f"ends it"]
        assert out.splitlines()[-1].endswith(
            f"{plural(created, 'run')} created, 0 updated, {up_to_date} up to date, 0 conflicts; "
            + ("20 points and 4 artifacts added" if created else "nothing added") + "; 1 run left RUNNING")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sync_to_a_server_and_back(ddl_home, team_server, capsys, monkeypatch):
    """A laptop's runs to the team server (its password, in the environment, never printed), a second sync adding
    nothing, and from the folders back into the laptop's emptied store: the same runs in both."""
    server = team_server.uri
    histories = {uid: _journal_a_run(ddl_home, sig, uid, shift, experiment="sync-team").runs()[uid]
                 for sig, uid, shift in (("sig1", "1" * 32, 0.0), ("sig2", "2" * 32, 1.0))}
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ddl")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-in-env")
    outputs = []
    for argv in (["sync", "--to", server], ["sync", "--to", server], ["sync"]):
        assert sync.main(argv) == 0, capsys.readouterr()
        outputs.append("".join(capsys.readouterr()))
    assert f"into {server}: 2 runs created" in outputs[0] and not any("s3cret" in text for text in outputs)
    assert outputs[1].endswith("2 up to date, 0 conflicts; nothing added\n"), outputs[1]
    assert f"into {store_uri(ddl_home)}: 2 runs created" in outputs[2], outputs[2]   # the laptop's store was empty
    from mlflow.tracking import MlflowClient
    for client in (MlflowClient(server), MlflowClient(store_uri(ddl_home))):
        runs = _runs_by_origin(client, "sync-team")
        assert sorted(runs) == sorted(histories)
        for uid, history in histories.items():
            _assert_holds(client, runs[uid], history)


@pytest.mark.parametrize("target, allowed", [
    ("http://ddl:s3cret@127.0.0.1:{port}", "no MLflow server answers"),
    ("ftp://ddl:s3cret@host/x", "not an MLflow tracking URI; allowed: sqlite:///<path>"),
    ("postgresql://ddl:s3cret@host/x\nsqlite:///lab.db", "a control character (a newline?) in it; allowed: sqlite:///"),
])
def test_a_target_that_cannot_be_used_is_one_line_without_its_password(ddl_home, capsys, monkeypatch, target, allowed):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret-too")
    _journal_a_run(ddl_home, "sig1", "1" * 32)
    assert sync.main(["sync", "--to", target.format(port=_free_port())]) == 2
    out, err = capsys.readouterr()
    assert not out and len(err.splitlines()) == 1 and allowed in err and "ddl:***@" in err and "s3cret" not in err
    assert not (ddl_home / "mlflow.db").exists()


def _snapshot(experiment: str) -> dict:
    """What the report and a user read of an experiment's runs, by signature: name, status, times, params, tags,
    every point of every curve and evaluation, datasets, artifacts and their sizes."""
    from ddl.track import store
    client = store.client()
    found = client.get_experiment_by_name(experiment)
    snapshot = {}
    for run in client.search_runs([found.experiment_id]):
        info, data = run.info, run.data
        points = {key: sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(info.run_id, key))
                  for key in data.metrics}          # MLflow's system metrics included
        artifacts = {a.path: a.file_size for folder in (None, "checkpoint")
                     for a in client.list_artifacts(info.run_id, folder) if not a.is_dir}
        snapshot[data.tags["ddl.signature"]] = (
            info.run_name, info.status, info.start_time, info.end_time, data.params,
            {k: v for k, v in data.tags.items() if k != sync.ORIGIN_TAG}, points,
            [(d.dataset.name, d.dataset.digest, d.dataset.profile) for d in run.inputs.dataset_inputs], artifacts)
    return snapshot


def _tables(folder: Path) -> dict:
    return {path.name: path.read_text() for path in sorted(folder.iterdir()) if path.suffix in (".csv", ".md", ".tex")}


@pytest.mark.slow
def test_a_sweeps_deleted_store_is_rebuilt_by_sync_with_every_point_and_the_same_report(ddl_home, tmp_path):
    sweep = run_cli("ddl-run", "-m", "residual=ddl,baseline", "dv=1,4", "model=micro", "train=smoke",
                    "experiment=rebuild", "eval=offline", "eval.limit=5")
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    before = _snapshot("rebuild")
    assert len(before) == 3 and all(any(k.startswith("eval/") for k in run[6]) for run in before.values())
    assert run_cli("ddl-report", "--experiment", "rebuild", "--out", str(tmp_path / "before")).returncode == 0
    (ddl_home / "mlflow.db").unlink()
    synced = run_cli("ddl-track", "sync")
    assert synced.returncode == 0 and "3 runs created, 0 updated" in synced.stdout, synced.stdout + synced.stderr
    assert _snapshot("rebuild") == before
    report = run_cli("ddl-report", "--experiment", "rebuild", "--out", str(tmp_path / "after"))
    assert report.returncode == 0, report.stdout + report.stderr
    assert _tables(tmp_path / "after" / "rebuild") == _tables(tmp_path / "before" / "rebuild") != {}
    again = run_cli("ddl-track", "sync")
    assert again.returncode == 0 and "0 runs created, 0 updated, 3 up to date" in again.stdout, again.stdout
    assert again.stdout.strip().endswith("nothing added")
