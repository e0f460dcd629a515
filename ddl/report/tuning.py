"""What tuning changed, from a search's runs. Each row's searches (its replicates, `tune.replicates`) are one row of
the tuned table: its loss at its optimum (the mean over replicates of each replicate's best at its fresh seeds, never
the seed that selected it) with the 95% interval over replicates, which carries the search's luck; the best values
each replicate found (or "not bracketed"); against the tuned baseline's replicates, paired by replicate, the verdict
at equal tokens (at the confidence of the look that ended it) and at equal compute (ddl.report.compute); the gap at
a value both rows tried (one seed), and whether tuning changed the verdict. Pure but for pandas: the runs and the
searches' parent runs come from ddl.track.query.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pandas as pd

from ..costs import COMPUTE_MEASURES
from ..stats import CONFIDENCE, mean_interval
from ..tune.sequential import FAILED, Look, at_look, seeds_reached
from ..tune.workflow import NOT_BRACKETED, verdict
from .compute import at_equal_compute
from .render import at_compute_cells, relative_text, resolvable
from .tables import (PAPER_ROWS, Cell, Column, Table, family_and_n_h, json_object, row_label,
                     trial_values)


def _of_search(runs: pd.DataFrame, search: str) -> pd.DataFrame:
    return runs[runs.get("tags.ddl.search", pd.Series(index=runs.index, dtype=str)) == search]


def _at(runs: pd.DataFrame, values: dict) -> pd.DataFrame:
    return runs[trial_values(runs).map(lambda v: v == values)]


def _confirmed(own: pd.DataFrame, best: dict) -> pd.DataFrame:
    """A replicate's runs at its best at fresh seeds: its confirmation runs (never the trial that selected it)."""
    at = _at(own, best)
    return at[at.get("tags.ddl.role", pd.Series(index=at.index, dtype=str)) == "confirm"]


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
    """Every search's confirmation runs at its best values (a carried row's runs): each row at its own best, the
    runs the view across sizes pairs."""
    return pd.concat([_confirmed(own, best) for _, own, best in _found(runs, searches)] or [runs.iloc[:0]])


def tuned_note(searches: pd.DataFrame) -> str:
    """What the view across sizes of a searched experiment pairs: each row at its own best, searched where."""
    carried = sorted(set(searches.get("tags.ddl.carried_from", pd.Series(dtype=object)).dropna()) - {""})
    where = f"searched at {', '.join(carried)} and carried to the other sizes" if carried else "searched at each size"
    return (f"Each row at its own best values ({where}) at its fresh seeds, every replicate's, paired by seed with "
            "the tuned baseline of its size; a search's trials are left out (the tuned table, the sensitivity figure).")


class _Row:
    """A row's replicates at a size: each replicate's parent run, runs, best values and confirmation runs."""

    def __init__(self, replicates: list[tuple[pd.Series, pd.DataFrame, dict]]):
        self.replicates = sorted(replicates, key=lambda f: _replicate_number(f[0]))
        self.parent, self.own, self.best = self.replicates[0]
        self.name = self.own["params.model.row"].iloc[0]
        self.size = self.own["params.model.size"].iloc[0]
        replica = self.own.get("params.replica", pd.Series(dtype=object)).dropna()
        self.replica = int(replica.iloc[0]) if not replica.empty else None   # a copy of the row (tuned_aa)
        confirmed = {_replicate_number(p): _confirmed(own, best) for p, own, best in self.replicates}
        self.confirmed = pd.concat(confirmed.values())
        self.values = {r: _confirmation_losses(runs) for r, runs in confirmed.items()}   # replicate -> {seed: loss}
        self.open = [f"{_tag(p, 'tags.ddl.replicate') or 0}: {_tag(p, 'tags.ddl.unbracketed')}"
                     for p, _, _ in self.replicates if _tag(p, "tags.ddl.unbracketed")]

    @property
    def search(self) -> str:
        return self.parent["tags.ddl.search"]

    def means(self) -> dict:
        """{replicate: its mean loss over its confirmation seeds}, a replicate with a failed run left out."""
        return {r: sum(v.values()) / len(v) for r, v in self.values.items()
                if v and all(math.isfinite(x) for x in v.values())}

    def replicate_of(self) -> dict:
        """{seed: its replicate}: the grouping of the equal-compute comparison."""
        return {str(seed): r for r, seeds in self.values.items() for seed in seeds}


def _confirmation_losses(confirmed: pd.DataFrame) -> dict:
    """{seed: final val/loss} of confirmation runs that ended; one that diverged or failed at FAILED (never
    dropped, as the decision counted it: ddl.tune.workflow.confirmed)."""
    ended = confirmed[confirmed["status"].isin(["FINISHED", "FAILED", "KILLED"])]
    losses = ended["metrics.final/val/loss"] if "metrics.final/val/loss" in ended else pd.Series(index=ended.index)
    return {int(seed): float(loss) if status == "FINISHED" and pd.notna(loss) else FAILED
            for seed, loss, status in zip(ended["params.seed"], losses, ended["status"], strict=True)}


def _by_replicate(replicate_of: dict):
    """{seed: loss} -> {replicate: mean loss}: the tuned table's unit, each seed's replicate its run's parent's."""
    def grouped(values: dict) -> dict:
        groups: dict = {}
        for seed, loss in values.items():
            groups.setdefault(replicate_of[str(seed)], []).append(loss)
        return {r: sum(v) / len(v) for r, v in groups.items()}
    return grouped


def tuned_table(runs: pd.DataFrame, searches: pd.DataFrame, sizes: list[str], unit: str,
                histories: pd.DataFrame | None = None, measure: str = "flops") -> Table | None:
    """A row per paper row (and per further search of it at a size), a column per size: the loss at the row's
    optimum over its replicates; under it, per size, each row against its tuned baseline at equal tokens and at equal
    compute."""
    found = _found(runs, searches) if not searches.empty else []
    if not found:
        return None
    groups: dict[str, list] = {}
    for search, own, best in found:
        groups.setdefault(_tag(search, "tags.ddl.row_search") or search["tags.ddl.search"], []).append(
            (search, own, best))
    rows = [_Row(replicates) for replicates in groups.values()]
    sizes = [s for s in sizes if any(r.size == s for r in rows)]
    rows.sort(key=lambda r: (*_place(r.own, sizes), r.replica or 0))
    columns = [Column(f"{size}/val_loss", f"{size.capitalize()} valid loss at its optimum", False) for size in sizes]
    table = Table("tuned", "Each row at its own optimum (tuned)", [], columns, interval="CI at its last look",
                  measure=measure, unit="replicate")
    placed, by_search = _placed(rows, table, sizes)
    notes = [note for size in sizes for note in _size_section(table, size, placed, by_search, histories, measure,
                                                              len(sizes) > 1)]
    carried = "; a carried row's replicates run its row's best from the search size" \
        if any(_tag(r.parent, "tags.ddl.carried_from") for r in rows) else ""
    table.note = (f"Loss in {unit}, mean ± std over replicates, each replicate its search's best at fresh seeds "
                  f"(never the seed that selected it{carried}). " + " ".join(notes))
    return table


def _placed(rows: list, table: Table, sizes: list[str]) -> tuple[list, dict]:
    """Each row's label in the table ((label, row) in order; a row carried to other sizes keeps its label at each)
    and its cell at its size; search id -> (label, row)."""
    twins = Counter((r.name, r.size) for r in rows)
    placed, by_search = [], {}
    for row in rows:
        label = row.name
        if twins[row.name, row.size] > 1 and row.replica is not None:        # copies of one row (`replica`)
            label = f"{row.name} replica={row.replica}"
        elif any(r.name == row.name and r.size == row.size for _, r in placed):  # another search of it
            label = f"{row.name} search={row.search}"
        placed.append((label, row))
        by_search.update({search["tags.ddl.search"]: (label, row) for search, _, _ in row.replicates})
        if label not in table.rows:
            table.rows.append(label)
            table.cells.update({(label, f"{s}/val_loss"): Cell(marker="—") for s in sizes})
        table.cells[label, f"{row.size}/val_loss"] = _estimate_cell(row.means())
    return placed, by_search


def _size_section(table: Table, size: str, placed: list, by_search: dict, histories, measure: str,
                  several_sizes: bool) -> list[str]:
    """The size's section: each row against its tuned baseline, paired by replicate; returns the rows' notes."""
    lines, notes = [], []
    for label, row in placed:
        if row.size != size:
            continue
        base = by_search.get(_tag(row.parent, "tags.ddl.baseline_search"))
        line, tokens = _versus(label, row, base[1] if base else None, histories, measure)
        lines.append(line)
        notes.append(_row_note(label, size if several_sizes else "", row, base[1] if base else None, tokens))
    headers = ["Model", "replicates", "loss at its optimum [95% CI over replicates]", "best values",
               f"at equal tokens: Δ % [{table.interval}]", "verdict",
               f"at equal compute ({COMPUTE_MEASURES[measure]}): Δ %", "verdict at equal compute", "how"]
    table.sections.append((f"{size.capitalize()}: each row at its optimum against the tuned baseline, paired by "
                           "replicate", headers, lines))
    return notes


def _estimate_cell(means: dict) -> Cell:
    if not means:
        return Cell(marker="—")
    values = pd.Series(means)
    return Cell(values.mean(), values.std() if len(values) > 1 else None, len(values), seeds=means)


def _versus(label: str, row: _Row, base: _Row | None, histories, measure: str):
    """A row's line under the tuned table (its estimate, best values, and its verdicts against the baseline), and its
    difference at equal tokens."""
    estimate = mean_interval(row.means().values())
    loss = "" if estimate is None else f"{estimate.mean:.4f}" + (
        f" [{estimate.low:.4f}, {estimate.high:.4f}]" if estimate.low is not None else "")
    values = "; ".join(_values_text(best) for _, _, best in row.replicates)
    if row.open:
        values += f" (not bracketed: replicate {'; '.join(row.open)})"
    carried = _tag(row.parent, "tags.ddl.carried_from")
    values += f" (carried from {carried})" if carried else ""
    line = [row_label(label), str(len(row.replicates)), loss, values]
    if base is None:
        return line + ["", "(the baseline)", "", "", ""], None
    if row.open or base.open:
        return line + ["", NOT_BRACKETED + ("" if row.open else " (the baseline)"), "", "", ""], None
    found = _decision(row, base)
    compute = None if histories is None else at_equal_compute(
        row.confirmed, base.confirmed, histories, measure, confidence=1 - found.level,
        unit=_by_replicate({**base.replicate_of(), **row.replicate_of()}))
    tokens = found.difference
    said = verdict(found, True) + (resolvable(tokens, found.level, "replicate") if tokens else "")
    return line + [relative_text(tokens), said, *at_compute_cells(compute)], tokens


def _decision(row: _Row, base: _Row) -> Look:
    """The look that decided the row (its parent's tags: the seeds a replicate and the level), over the replicates
    as their parents name them: the driver's own computation (ddl.tune.sequential.at_look); without the tags (a
    search stopped before its verdict), the plain 95% look at the seeds both have."""
    n, level = _tag(row.parent, "tags.ddl.look_seeds"), _tag(row.parent, "tags.ddl.look_level")
    if n and level:
        return at_look(row.values, base.values, int(n), float(level))
    return at_look(row.values, base.values, seeds_reached(row.values, base.values), 1 - CONFIDENCE)


def _place(own: pd.DataFrame, sizes: list[str]) -> tuple[int, int]:
    """A search's place in the table: its paper row's (the paper's order, others after), then its size's."""
    order = list(PAPER_ROWS)
    family = family_and_n_h(own["params.model.row"].iloc[0])[0]
    return order.index(family) if family in order else len(order), sizes.index(own["params.model.size"].iloc[0])


def _tag(search: pd.Series, tag: str) -> str:
    """A parent run's tag, "" where it has none (MLflow's frame: NaN where another parent has it)."""
    value = search.get(tag)
    return value if isinstance(value, str) else ""


def _replicate_number(search: pd.Series) -> int:
    """A parent run's replicate, for order only (seeds pair replicates); a tag edited into a non-number: 0."""
    text = _tag(search, "tags.ddl.replicate")
    return int(text) if text.isdigit() else 0


def _values_text(values: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _row_note(label: str, size: str, row: _Row, base: _Row | None, tokens) -> str:
    """A row's best values at `size` (a carried row's are its row's from the size it is carried from) and against
    the tuned baseline the gap at a value both first replicates tried, with whether tuning changed the verdict."""
    carried = _tag(row.parent, "tags.ddl.carried_from")
    text = (f"{row_label(label)}{f' at {size}' if size else ''}: {f'carried from {carried}' if carried else 'best'} "
            + "; ".join(_values_text(best) for _, _, best in row.replicates))
    shared = None if base is None else _shared_gap(row.own, base.own)
    if shared is None or tokens is None or tokens.relative is None:
        return text + "."
    values, gap = shared
    verdict = tokens.verdict(False)
    changed = verdict != ("better" if gap < 0 else "worse")
    return (text + f"; at a shared {_values_text(values)} (the baseline's best of the values both first replicates "
            f"tried) {gap:+.1f}% (one seed: suggests {'better' if gap < 0 else 'worse'}), at each row's optimum "
            f"{tokens.relative:+.1f}% ({verdict}): tuning {'changed' if changed else 'did not change'} the verdict.")


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
