"""What tuning changed, from a search's runs: each row at its own best (mean ± std over the confirmation's
seeds, paired with the tuned baseline at the confidence of the look that ended it), the best values found
(flagged at the edge of their range), the gap at a value both rows tried (one seed), and whether tuning
changed the verdict. Pure but for pandas: the runs and the searches' parent runs come from ddl.track.query.
"""

from __future__ import annotations

import json

import pandas as pd

from ..stats import CONFIDENCE, paired
from .tables import (BASELINE, PAPER_ROWS, Column, Table, _cell, family_and_n_h, json_object, row_label,
                     trial_values)


def _of_search(runs: pd.DataFrame, search: str) -> pd.DataFrame:
    return runs[runs.get("tags.ddl.search", pd.Series(index=runs.index, dtype=str)) == search]


def _at(runs: pd.DataFrame, values: dict) -> pd.DataFrame:
    return runs[trial_values(runs).map(lambda v: v == values)]


def _found(runs: pd.DataFrame, searches: pd.DataFrame) -> list[tuple[pd.Series, pd.DataFrame, dict]]:
    """(parent run, its runs, its best values) per search that has runs and a best."""
    found = []
    for _, search in searches.iterrows():
        own = _of_search(runs, search["tags.ddl.search"])
        best = json_object(search.get("tags.ddl.best_values"))
        if not own.empty and best:
            found.append((search, own, best))
    return found


def best_runs(runs: pd.DataFrame, searches: pd.DataFrame) -> pd.DataFrame:
    """Every search's runs at its best values (a searched row's best trial and confirmation, a carried row's
    runs): each row at its own best, the runs the view across sizes pairs."""
    return pd.concat([_at(own, best) for _, own, best in _found(runs, searches)] or [runs.iloc[:0]])


def tuned_note(searches: pd.DataFrame) -> str:
    """What the view across sizes of a searched experiment pairs: each row at its own best, searched where."""
    carried = sorted(set(searches.get("tags.ddl.carried_from", pd.Series(dtype=object)).dropna()) - {""})
    where = f"searched at {', '.join(carried)} and carried to the other sizes" if carried else "searched at each size"
    return (f"Each row at its own best values ({where}), paired with the tuned baseline of its size; a search's "
            "other trials are left out (the tuned table, the sensitivity figure).")


def tuned_table(runs: pd.DataFrame, searches: pd.DataFrame, sizes: list[str], unit: str) -> Table | None:
    """A row per paper row (and per further search of it at a size), a column per size: the loss at the row's
    best values over the confirmation's seeds, paired with its tuned baseline."""
    found = _found(runs, searches) if not searches.empty else []
    if not found:
        return None
    sizes = [s for s in sizes if any(own["params.model.size"].iloc[0] == s for _, own, _ in found)]
    found.sort(key=lambda f: _place(f[1], sizes))
    columns = [Column(f"{size}/val_loss", f"{size.capitalize()} valid loss", False) for size in sizes]
    table = Table("tuned", "Each row at its own best (tuned)", [], columns,
                  compared=[(f"{size}/val_loss", f"{size.capitalize()} valid loss at each row's best")
                            for size in sizes], interval="CI at its last look")
    by_search, notes = {}, []
    for search, own, best in found:
        row, size = own["params.model.row"].iloc[0], own["params.model.size"].iloc[0]
        if any(r == row and s == size for r, s, *_ in by_search.values()):
            row = f"{row} search={search['tags.ddl.search']}"
        if row not in table.rows:
            table.rows.append(row)
            table.cells.update({(row, f"{s}/val_loss"): _cell(own.iloc[:0], "final/val/loss", 1.0) for s in sizes})
        table.cells[row, f"{size}/val_loss"] = _cell(_at(own, best), "final/val/loss", 1.0)
        by_search[search["tags.ddl.search"]] = (row, size, search, own, best)
    for row, size, search, own, best in by_search.values():
        base = by_search.get(search.get("tags.ddl.baseline_search") or "")
        level = search.get("tags.ddl.look_level")
        confidence = 1 - float(level) if isinstance(level, str) and level else CONFIDENCE
        cell = table.cells[row, f"{size}/val_loss"]
        if base is not None:
            cell.versus = paired(cell.seeds, table.cells[base[0], f"{size}/val_loss"].seeds, confidence)
        notes.append(_row_note(row, size if len(sizes) > 1 else "", search, own, best, base, cell, confidence))
    carried = "; a carried row's seeds all run its row's best from the search size" \
        if any(_tag(search, "tags.ddl.carried_from") for search, _, _ in found) else ""
    table.note = (f"Loss in {unit}, mean ± std over the confirmation's seeds (seed 0: the trial that found the "
                  f"best{carried}). " + " ".join(notes))
    return table


def _place(own: pd.DataFrame, sizes: list[str]) -> tuple[int, int]:
    """A search's place in the table: its paper row's (the paper's order, others after), then its size's."""
    order = list(PAPER_ROWS)
    family = family_and_n_h(own["params.model.row"].iloc[0])[0]
    return order.index(family) if family in order else len(order), sizes.index(own["params.model.size"].iloc[0])


def _tag(search: pd.Series, tag: str) -> str:
    """A parent run's tag, "" where it has none (MLflow's frame: NaN where another parent has it)."""
    value = search.get(tag)
    return value if isinstance(value, str) else ""


def _values_text(values: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _row_note(row, size: str, search, own, best, base, cell, confidence: float) -> str:
    """A row's best values at `size` (and an edge flag; a carried row's are its row's from the size it is carried
    from), its interval's confidence, and against the tuned baseline the gap at a value both tried, with whether
    tuning changed the verdict."""
    edge, carried = (_tag(search, f"tags.ddl.{tag}") for tag in ("edge", "carried_from"))
    text = (f"{row_label(row)}{f' at {size}' if size else ''}: {f'carried from {carried}' if carried else 'best'} "
            f"{_values_text(best)}" + (" (at the edge: widen the range)" if edge else ""))
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
