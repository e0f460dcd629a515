"""A row's search as the store holds it: a parent run (`ddl.role=search`) and its trials and confirmation
runs as child runs (`mlflow.parentRunId`), each tagged with the search id. The store is the search's
state: a re-launched search, or another home on the team server, reads its trials back from here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .. import paths
from ..validation import shown
from . import store

SEARCH_TAG, ROLE_TAG, TRIAL_TAG = "ddl.search", "ddl.role", "ddl.trial"
WON_TAG = "ddl.trial_won"     # a trial run that passed its claim's first look (trial_won_elsewhere)
VALUES_TAG = "ddl.trial_values"        # the searched keys' override values, JSON {key: value}
PRUNED_TAG = "ddl.pruned"              # `step <n>: <why>` on a trial the pruner stopped (its run KILLED)
PARENT_TAG = store.PARENT_TAG


@dataclass
class Trial:
    """One run of a search, as the store holds it."""
    run_id: str
    number: int
    role: str                          # trial | confirm
    values: dict                       # {key: override value}
    seed: int
    state: str                         # complete | pruned | running | failed | stopped (resumable)
    value: float | None                # final val/loss (complete), or its last one (pruned)
    curve: dict = field(default_factory=dict)    # step -> val/loss


def _state(run, now: float) -> str:
    tags, status = run.data.tags, run.info.status
    if status == "FINISHED":
        return "complete"
    if PRUNED_TAG in tags:
        return "pruned"
    if status == "RUNNING" and now - float(tags.get(store.HEARTBEAT_TAG) or 0) <= store.STALE_AFTER_S:
        return "running"
    return "failed" if status == "FAILED" and "NonFiniteLoss" in tags.get(store.ERROR_TAG, "") else "stopped"


class DamagedSearch(ValueError):
    """A search's record the store cannot continue from: one line naming the run and what to do."""


_warned: set[str] = set()       # runs this process has said it leaves out (once each, not every round)


def _leave_out(run_id: str, why: str) -> None:
    if run_id not in _warned:
        _warned.add(run_id)
        print(f"ddl-run: warning: MLflow run {run_id}: {why}; the search goes on without it", flush=True)


def _trial(run, curve: dict, now: float, keys) -> Trial | None:
    """A stored run as a Trial; None, said in one line, when its search tags are damaged: a trial number
    that is not one, searched values that are not a JSON object of the searched keys (`keys`, when given)."""
    tags, run_id = run.data.tags, run.info.run_id
    try:
        number = int(tags.get(TRIAL_TAG, -1))
    except ValueError:
        _leave_out(run_id, f"{TRIAL_TAG}={shown(tags[TRIAL_TAG])} is not a trial number")
        return None
    try:
        values = json.loads(tags.get(VALUES_TAG, "{}"))
    except ValueError:
        values = None
    if not isinstance(values, dict) or (keys is not None and sorted(values) != sorted(keys)):
        wanted = f" of the searched keys ({', '.join(keys)})" if keys is not None else ""
        _leave_out(run_id, f"{VALUES_TAG}={shown(tags.get(VALUES_TAG))} is not a JSON object{wanted}")
        return None
    state = _state(run, now)
    value = run.data.metrics.get("final/val/loss") if state == "complete" else run.data.metrics.get("val/loss")
    return Trial(run_id, number, tags[ROLE_TAG], values, int(run.data.params.get("seed", 0)), state, value, curve)


def runs_of(experiment: str, search: str, curves: bool = False, keys=None) -> list[Trial]:
    """The search's trials and confirmation runs in the experiment, oldest first; with `curves`, each
    one's val/loss points (the pruner's intermediate values); with `keys`, the searched keys each must
    hold. A damaged run (`_trial`), or one moved to another experiment, is left out, saying so once."""
    if not store.exists():
        return []
    c = store.client()
    found = c.get_experiment_by_name(experiment)
    if found is None:
        return []
    names = store.experiment_names()
    runs = c.search_runs(list(names), f"tags.`{SEARCH_TAG}` = '{search}' and tags.`ddl.sweep` = '{experiment}'",
                         order_by=["attributes.start_time ASC"])
    now, trials = time.time(), []
    for run in runs:
        tags = run.data.tags
        if tags.get(ROLE_TAG) not in ("trial", "confirm"):
            continue
        if run.info.experiment_id != found.experiment_id:
            _leave_out(run.info.run_id, f"a run of search {search} in experiment "
                                        f"'{names[run.info.experiment_id]}', not '{experiment}' (moved)")
            continue
        curve = {m.step: m.value for m in c.get_metric_history(run.info.run_id, "val/loss")} if curves else {}
        trial = _trial(run, curve, now, keys)
        if trial is not None:
            trials.append(trial)
    return trials


def numbers_taken(experiment: str, search: str) -> set[int]:
    """The trial numbers the search's runs in the experiment hold, a run whose searched values are damaged
    included: a new trial takes none of them (a damaged trial keeps its number, as it keeps its claim)."""
    c = store.client()
    found = c.get_experiment_by_name(experiment)
    runs = [] if found is None else c.search_runs(
        [found.experiment_id], f"tags.`{SEARCH_TAG}` = '{search}' and tags.`{ROLE_TAG}` = 'trial'")
    return {int(number) for run in runs if (number := run.data.tags.get(TRIAL_TAG, "")).isdigit()}


def trial_taken(experiment: str, search: str, number: int, signature: str, besides=None) -> str | None:
    """Who has trial `number` of the search with other values (another signature): `MLflow run <id> (host,
    home)`, else None. Two homes that ask the same trial number at once claim it like a signature: with
    `besides` (this job's own new run) only a run that started first counts, and the later one leaves."""
    c = store.client()
    found = c.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = c.search_runs([found.experiment_id], f"tags.`{SEARCH_TAG}` = '{search}' and tags.`{ROLE_TAG}` = 'trial' "
                         f"and tags.`{TRIAL_TAG}` = '{number}'", order_by=["attributes.start_time ASC"])
    for run in runs:
        if run.data.tags.get(store.SIGNATURE_TAG) == signature:
            continue
        if besides is not None and (run.info.start_time, run.info.run_id) >= (besides.info.start_time,
                                                                              besides.info.run_id):
            continue
        tags = run.data.tags
        return f"trial {number} is MLflow run {run.info.run_id} ({tags.get('ddl.host', 'unknown host')}, " \
               f"{tags.get(store.HOME_TAG, 'unknown home')})"
    return None


def trial_won_elsewhere(experiment: str, search: str, number: int, mine) -> str | None:
    """The claim's second look, after `mine` (this job's new run of trial `number`) passed the first
    (trial_taken) and was marked won: another run of that number marked won, or None. A rival whose request
    landed after the first look, though stamped earlier, passed its first look too; each marks itself before it
    looks again, so the later of two second looks sees the other's mark, and that job leaves: one trains (or, in
    a tie, neither: the number is asked again next round), never two."""
    c = store.client()
    runs = c.search_runs([mine.info.experiment_id], f"tags.`{SEARCH_TAG}` = '{search}' and tags.`{ROLE_TAG}` = "
                         f"'trial' and tags.`{TRIAL_TAG}` = '{number}' and tags.`{WON_TAG}` = '1'")
    for run in runs:
        if run.info.run_id != mine.info.run_id:
            tags = run.data.tags
            return f"trial {number} is MLflow run {run.info.run_id} ({tags.get('ddl.host', 'unknown host')}, " \
                   f"{tags.get(store.HOME_TAG, 'unknown home')})"
    return None


def _folder(search: str):
    return paths.runs_dir() / f"{store.SEARCH_FOLDER_PREFIX}{search}"


def _parents(c, experiment_id: str, search: str, deleted: bool = False) -> list:
    """The search's parent runs, first started first (start time, then run id: every home orders them alike)."""
    from mlflow.entities import ViewType
    found = c.search_runs([experiment_id], f"tags.`{SEARCH_TAG}` = '{search}' and tags.`{ROLE_TAG}` = 'search'",
                          run_view_type=ViewType.DELETED_ONLY if deleted else ViewType.ACTIVE_ONLY)
    return sorted(found, key=lambda run: (run.info.start_time, run.info.run_id))


def parent_run(experiment: str, search: str, name: str, tags: dict) -> str:
    """The search's parent run: found by its search id (another home's, or an earlier launch's), else
    created, journaled in `runs/search-<id>/` like every run, so `ddl-track sync` brings it back. It is
    claimed like a signature: of two homes that create one at once, the later deletes its own (KILLED,
    `ddl.lost_claim`) and takes the first. A parent deleted (in MLflow's UI) while its trials are not is a
    DamagedSearch naming it."""
    from .runs import TrackedRun
    c = store.client()
    experiment_id = store.experiment_id(experiment)
    found = _parents(c, experiment_id, search)
    if found:
        return found[0].info.run_id
    gone = _parents(c, experiment_id, search, deleted=True)
    children = c.search_runs([experiment_id], f"tags.`{SEARCH_TAG}` = '{search}'", max_results=1)
    if gone and children:
        parent = children[0].data.tags.get(PARENT_TAG) or gone[0].info.run_id
        raise DamagedSearch(f"{name}: its parent MLflow run {parent} is deleted while its trials are not; "
                            f"restore it (mlflow runs restore --run-id {parent}), or delete its trials as well "
                            f"to search afresh")
    run = TrackedRun.create(experiment, _folder(search), name, {},
                            {**tags, SEARCH_TAG: search, ROLE_TAG: "search"})
    store.settle_claim()
    first = _parents(c, experiment_id, search)[0]
    if first.info.run_id != run.id:
        run.lose_claim(f"MLflow run {first.info.run_id} ({first.data.tags.get(store.HOME_TAG, 'unknown home')})")
    return first.info.run_id


def _active(parent: str) -> None:
    """A DamagedSearch where the parent run was deleted while the search ran."""
    if store.client().get_run(parent).info.lifecycle_stage == "deleted":
        raise DamagedSearch(f"the search's parent MLflow run {parent} was deleted while it ran; restore it "
                            f"(mlflow runs restore --run-id {parent}) and run the same command again")


def record_best(search: str, parent: str, best: dict[str, float], values: dict, tags: dict | None = None) -> None:
    """The search's result on its parent run: the best value of each searched key and its loss as
    metrics (`best/<key>`, `best/val_loss`), the override values as a tag, and its state."""
    from .runs import TrackedRun
    _active(parent)
    run = TrackedRun(parent, _folder(search))
    run.log_summary(best)
    run.set_tags({"ddl.best_values": json.dumps(values, sort_keys=True), **(tags or {})})


def close(search: str, parent: str) -> None:
    from .runs import TrackedRun
    _active(parent)
    TrackedRun(parent, _folder(search)).terminate("FINISHED")
