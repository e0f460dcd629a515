"""A run folder's journal (ddl.track.journal) and `ddl-track sync`, which rebuilds a store from the folders."""

import json
import math
import os
import subprocess
import sys

import pytest

from ddl.track import journal as journal_module
from ddl.track.journal import Journal, JournalDamaged


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
    assert journal.records() == whole
    journal.append("status", "a" * 32, status="KILLED", end_time=None)   # the job resumed after the crash
    assert journal.records()[:-1] == whole and journal.records()[-1]["status"] == "KILLED"
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
