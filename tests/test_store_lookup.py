"""store.Lookup: a plan's questions about many signatures, each status's runs read in one search, answer as each
signature's own searches do, in a real SQLite store; where the store holds more runs than the search's cap, they
are searched signature by signature."""

import time

import pytest

from ddl.track import store

OTHER_HOME = {store.HOME_ID_TAG: "another-home", store.HOME_TAG: "/elsewhere", "ddl.host": "node7"}


def add_run(client, experiment_id: str, signature: str, status: str = "FINISHED", tags=None, metrics=None) -> str:
    """A run started a second after the one before: newest first is an order."""
    add_run.started += 1000
    run = client.create_run(experiment_id, start_time=add_run.started,
                            tags={store.SIGNATURE_TAG: signature, **(tags or {})})
    for key, value in (metrics or {}).items():
        client.log_metric(run.info.run_id, key, value)
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)
    return run.info.run_id


add_run.started = int(time.time() * 1000)


@pytest.fixture
def stocked(ddl_home):
    """Experiments a, b and a deleted c, with runs of signatures s1-s5 (s6 none); the ids of the FINISHED runs that
    count."""
    client = store.client()
    a, b, c = (store.experiment_id(name) for name in "abc")
    own, fresh = store.home_tags(), str(int(time.time()))
    add_run(client, a, "s1", tags=own, metrics={"final/val/loss": 2.1})                # older: not the answer
    ids = {
        "s1 in a": add_run(client, a, "s1", tags=own, metrics={"final/val/loss": 2.0,
                                                                  "eval/0shot/task/n": 5}),
        "s1 in b": add_run(client, b, "s1", tags={**own, store.REUSED_FROM_TAG: "a"}),
        "s2 in b, reused": add_run(client, b, "s2", tags={**own, store.REUSED_FROM_TAG: "x"}),
        "s3 in b": add_run(client, b, "s3", tags=OTHER_HOME, metrics={"final/val/loss": 2.5}),
    }
    add_run(client, a, "s2", status="FAILED", tags=own)                                 # not FINISHED: no answer
    add_run(client, c, "s5", tags=own)                                                  # c is deleted below
    add_run(client, a, "s4", status="RUNNING", tags={**OTHER_HOME, store.HEARTBEAT_TAG: fresh})
    add_run(client, a, "s5", status="RUNNING", tags={**own, store.HEARTBEAT_TAG: fresh})  # this home's own
    add_run(client, b, "s3", status="RUNNING", tags={**OTHER_HOME, store.HEARTBEAT_TAG: "0"})  # stale
    client.delete_experiment(c)
    return ids


SIGNATURES = ["s1", "s2", "s3", "s4", "s5", "s6"]


def answers(lookup_of) -> dict:
    """Every question a plan asks, of every signature, with `lookup_of(signature)` as the lookup."""
    found = {}
    for signature in SIGNATURES:
        for experiment in "ab":
            done = store.finished(signature, experiment, lookup=lookup_of(signature))
            evaluated = store.finished(signature, experiment, ["task@0"], lookup=lookup_of(signature))
            other = store.finished_elsewhere(signature, experiment, lookup=lookup_of(signature))
            found[signature, experiment] = tuple(None if s is None else (s.run_id, s.experiment, s.trained_by)
                                                 for s in (done, evaluated, other))
        found[signature] = store.running_elsewhere(signature, lookup=lookup_of(signature))
    return found


def test_a_plans_lookup_answers_as_each_signatures_own_searches(stocked, monkeypatch):
    alone = answers(lambda signature: None)
    assert alone["s1", "a"] == ((stocked["s1 in a"], "a", None),) * 2 + ((stocked["s1 in b"], "b", None),)
    assert alone["s1", "b"] == ((stocked["s1 in b"], "b", None), None, (stocked["s1 in a"], "a", None))
    assert alone["s2", "a"] == (None, None, (stocked["s2 in b, reused"], "b", None))
    assert alone["s3", "a"] == (None, None, (stocked["s3 in b"], "b", "node7:/elsewhere"))
    assert alone["s5", "a"] == alone["s6", "a"] == (None, None, None)          # the deleted experiment's run
    assert alone["s4"] == "node7, /elsewhere" and alone["s3"] is alone["s5"] is alone["s6"] is None

    whole = store.Lookup(SIGNATURES)
    assert answers(lambda signature: whole) == alone
    assert whole._read_whole == {"FINISHED": True, "RUNNING": True}   # one search a status

    monkeypatch.setattr(store, "BULK_RUNS_PER_SIGNATURE", 0)           # the store holds more than the cap
    searched = store.Lookup(SIGNATURES)
    assert answers(lambda signature: searched) == alone
    assert searched._read_whole == {"FINISHED": False, "RUNNING": False}


@pytest.mark.parametrize("signatures", [["s1"], SIGNATURES], ids=["one signature", "a plan's"])
def test_a_lookup_of_a_store_not_created_finds_nothing_and_creates_none(ddl_home, signatures):
    lookup = store.Lookup(signatures)
    assert store.finished("s1", "a", lookup=lookup) is None is store.finished_elsewhere("s1", "a", lookup=lookup)
    assert store.running_elsewhere("s1", lookup=lookup) is None
    assert not store.exists() and not ddl_home.exists()


def test_a_lookup_refuses_what_is_not_a_signature(ddl_home):
    with pytest.raises(ValueError, match="signature=\"s1' or 1=1\": not a run signature"):
        store.Lookup(["s1", "s1' or 1=1"])
