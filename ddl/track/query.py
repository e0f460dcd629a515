"""Reading the store back for the report: runs as a DataFrame, metric histories, experiments."""

from __future__ import annotations

import pandas as pd

from .store import SIGNATURE_TAG, client


def ddl_experiments() -> list[str]:
    """Experiments holding at least one ddl run, oldest first."""
    c = client()
    names = []
    for exp in sorted(c.search_experiments(), key=lambda e: e.creation_time or 0):
        if c.search_runs([exp.experiment_id], f"tags.`{SIGNATURE_TAG}` != ''", max_results=1):
            names.append(exp.name)
    return names


def load_runs(experiment: str) -> pd.DataFrame:
    """One row per run: run_id, status, name, and `params.*`, `metrics.*` (latest values), `tags.*`."""
    import mlflow
    client()  # points mlflow at the project's store
    runs = mlflow.search_runs(experiment_names=[experiment], filter_string=f"tags.`{SIGNATURE_TAG}` != ''",
                              output_format="pandas")
    if "params.model.param" in runs:            # runs logged before the key existed ran the standard form
        runs["params.model.param"] = runs["params.model.param"].fillna("sp")
    return runs.rename(columns={"tags.mlflow.runName": "name"})


def load_searches(experiment: str) -> pd.DataFrame:
    """The experiment's searches: one row per parent run (`ddl.role=search`), with its tags and best metrics."""
    import mlflow
    client()
    return mlflow.search_runs(experiment_names=[experiment], filter_string="tags.`ddl.role` = 'search'",
                              output_format="pandas")


def load_histories(run_ids: list[str], keys: list[str]) -> pd.DataFrame:
    c = client()
    rows = [(run_id, key, m.step, m.value) for run_id in run_ids for key in keys
            for m in c.get_metric_history(run_id, key)]
    return pd.DataFrame(rows, columns=["run_id", "key", "step", "value"])


def finished_like(params: dict[str, str]) -> pd.DataFrame:
    """Every experiment's FINISHED ddl runs whose params hold these values (e.g. a size, its data and schedule),
    as load_runs' frame; empty where the store has none (a plan's look, which writes nothing)."""
    import mlflow
    client()
    where = " and ".join([f"tags.`{SIGNATURE_TAG}` != ''", "attributes.status = 'FINISHED'",
                          *(f"params.`{key}` = '{value}'" for key, value in params.items())])
    return mlflow.search_runs(search_all_experiments=True, filter_string=where, output_format="pandas")
