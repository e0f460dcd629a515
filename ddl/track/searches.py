"""A row's search as the store holds it: a parent run (`ddl.role=search`) and its trials and confirmation
runs as child runs (`mlflow.parentRunId`), each tagged with the search id. The store is the search's
state: a re-launched search, or another home on the team server, reads its trials back from here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .. import paths
from . import store

SEARCH_TAG, ROLE_TAG, TRIAL_TAG = "ddl.search", "ddl.role", "ddl.trial"
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


def runs_of(experiment: str, search: str, curves: bool = False) -> list[Trial]:
    """The search's trials and confirmation runs in the experiment, oldest first; with `curves`, each
    one's val/loss points (the pruner's intermediate values)."""
    if not store.exists():
        return []
    c = store.client()
    found = c.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs = c.search_runs([found.experiment_id], f"tags.`{SEARCH_TAG}` = '{search}'",
                         order_by=["attributes.start_time ASC"])
    now, trials = time.time(), []
    for run in runs:
        tags = run.data.tags
        if tags.get(ROLE_TAG) not in ("trial", "confirm"):
            continue
        curve = {m.step: m.value for m in c.get_metric_history(run.info.run_id, "val/loss")} if curves else {}
        state = _state(run, now)
        value = run.data.metrics.get("final/val/loss") if state == "complete" else run.data.metrics.get("val/loss")
        trials.append(Trial(run.info.run_id, int(tags.get(TRIAL_TAG, -1)), tags[ROLE_TAG],
                            json.loads(tags.get(VALUES_TAG, "{}")), int(run.data.params.get("seed", 0)), state,
                            value, curve))
    return trials


def _folder(search: str):
    return paths.runs_dir() / f"{store.SEARCH_FOLDER_PREFIX}{search}"


def parent_run(experiment: str, search: str, name: str, tags: dict) -> str:
    """The search's parent run: found by its search id (another home's, or an earlier launch's), else
    created, journaled in `runs/search-<id>/` like every run, so `ddl-track sync` brings it back."""
    from .runs import TrackedRun
    c = store.client()
    experiment_id = store.experiment_id(experiment)
    found = c.search_runs([experiment_id], f"tags.`{SEARCH_TAG}` = '{search}' and tags.`{ROLE_TAG}` = 'search'",
                          order_by=["attributes.start_time ASC"], max_results=1)
    if found:
        return found[0].info.run_id
    run = TrackedRun.create(experiment, _folder(search), name, {},
                            {**tags, SEARCH_TAG: search, ROLE_TAG: "search"})
    return run.id


def record_best(search: str, parent: str, best: dict[str, float], values: dict, tags: dict | None = None) -> None:
    """The search's result on its parent run: the best value of each searched key and its loss as
    metrics (`best/<key>`, `best/val_loss`), the override values as a tag, and its state."""
    from .runs import TrackedRun
    run = TrackedRun(parent, _folder(search))
    run.log_summary(best)
    run.set_tags({"ddl.best_values": json.dumps(values, sort_keys=True), **(tags or {})})


def close(search: str, parent: str) -> None:
    from .runs import TrackedRun
    TrackedRun(parent, _folder(search)).terminate("FINISHED")
