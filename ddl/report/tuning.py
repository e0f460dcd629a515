"""What tuning changed, from a search's runs: each row at its own best (mean ± std over the confirmation's
seeds, paired with the tuned baseline at the confidence of the look that ended it), the best values found
(flagged at the edge of their range), the gap at a value both rows tried (one seed), and whether tuning
changed the verdict. Pure but for pandas: the runs and the searches' parent runs come from ddl.track.query.
"""

from __future__ import annotations

import json

import pandas as pd

from ..stats import CONFIDENCE, paired
from .tables import BASELINE, Column, Table, _cell, row_label

SEARCHED = "tags.ddl.trial_values"


def trial_values(runs: pd.DataFrame) -> pd.Series:
    """Each run's searched values ({} for a run of no search)."""
    if SEARCHED not in runs:
        return pd.Series([{}] * len(runs), index=runs.index)
    return runs[SEARCHED].map(lambda text: json.loads(text) if isinstance(text, str) and text else {})


def _of_search(runs: pd.DataFrame, search: str) -> pd.DataFrame:
    return runs[runs.get("tags.ddl.search", pd.Series(index=runs.index, dtype=str)) == search]


def _at(runs: pd.DataFrame, values: dict) -> pd.DataFrame:
    return runs[trial_values(runs).map(lambda v: v == values)]


def tuned_table(runs: pd.DataFrame, searches: pd.DataFrame, unit: str) -> Table | None:
    """One row per search (its paper row), a column per size: the loss at the row's best values over the
    confirmation's seeds, paired with its tuned baseline."""
    if searches.empty:
        return None
    found = []
    for _, search in searches.iterrows():
        own = _of_search(runs, search["tags.ddl.search"])
        if own.empty or not isinstance(search.get("tags.ddl.best_values"), str):
            continue
        best = json.loads(search["tags.ddl.best_values"])
        found.append((search, own, best))
    if not found:
        return None
    sizes = list(dict.fromkeys(own["params.model.size"].iloc[0] for _, own, _ in found))
    columns = [Column(f"{size}/val_loss", f"{size.capitalize()} valid loss", False) for size in sizes]
    table = Table("tuned", "Each row at its own best (tuned)", [], columns,
                  compared=[(f"{size}/val_loss", f"{size.capitalize()} valid loss at each row's best")
                            for size in sizes], interval="CI at its last look")
    by_search, notes = {}, []
    for search, own, best in found:
        row, size = own["params.model.row"].iloc[0], own["params.model.size"].iloc[0]
        if any(r == row for r in table.rows):
            row = f"{row} search={search['tags.ddl.search']}"
        table.rows.append(row)
        for s in sizes:
            table.cells[row, f"{s}/val_loss"] = _cell(_at(own, best), "final/val/loss", 1.0) if s == size else \
                _cell(own.iloc[:0], "final/val/loss", 1.0)
        by_search[search["tags.ddl.search"]] = (row, size, search, own, best)
    for row, size, search, own, best in by_search.values():
        base = by_search.get(search.get("tags.ddl.baseline_search") or "")
        level = search.get("tags.ddl.look_level")
        confidence = 1 - float(level) if isinstance(level, str) and level else CONFIDENCE
        cell = table.cells[row, f"{size}/val_loss"]
        if base is not None:
            cell.versus = paired(cell.seeds, table.cells[base[0], f"{size}/val_loss"].seeds, confidence)
        notes.append(_row_note(row, search, own, best, base, cell, confidence))
    table.note = (f"Loss in {unit}, mean ± std over the confirmation's seeds (seed 0: the trial that found the "
                  f"best). " + " ".join(notes))
    return table


def _values_text(values: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _row_note(row, search, own, best, base, cell, confidence: float) -> str:
    """A row's best values (and an edge flag), its interval's confidence, and against the tuned baseline the
    gap at a value both tried, with whether tuning changed the verdict."""
    edge = search.get("tags.ddl.edge") or ""
    text = f"{row_label(row)}: best {_values_text(best)}" + (" (at the edge: widen the range)" if edge else "")
    if base is None or row.partition(" ")[0] == BASELINE:
        return text + "."
    text += f", paired at {confidence:.4g} confidence"
    shared = _shared_gap(own, base[3])
    tuned = cell.versus
    if shared is None or tuned is None or tuned.relative is None:
        return text + "."
    values, gap = shared
    verdict = tuned.verdict(False)
    changed = verdict != ("better" if gap < 0 else "worse")
    return (text + f"; at a shared {_values_text(values)} (the baseline's best of the values both tried) "
            f"{gap:+.1f}% (one seed: suggests {'better' if gap < 0 else 'worse'}), at each row's best "
            f"{tuned.relative:+.1f}% ({verdict}): tuning {'changed' if changed else 'did not change'} the verdict.")


def _shared_gap(own: pd.DataFrame, baseline: pd.DataFrame) -> tuple[dict, float] | None:
    """(values, the row's % gap there) at the values both searches' trials tried, the baseline's best of them."""
    def losses(runs: pd.DataFrame) -> dict[str, float]:
        done = runs[(runs["tags.ddl.role"] == "trial") & (runs["status"] == "FINISHED")]
        pairs = zip(trial_values(done), done["metrics.final/val/loss"], strict=True)
        return {json.dumps(v, sort_keys=True): loss for v, loss in pairs}
    mine, base = losses(own), losses(baseline)
    both = [k for k in base if k in mine]
    if not both:
        return None
    key = min(both, key=base.get)
    return json.loads(key), 100 * (mine[key] - base[key]) / base[key]
