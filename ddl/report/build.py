"""`reports/<experiment>/`: every table as .md/.tex/.csv (a search's tuned table among them), Figure 2, the
Delta diagnostics by layer and, where a key was searched or listed, the sensitivity to it as PNG/SVG (and,
for runs along one axis, width, depth or horizon, over listed learning rates, lr_transfer: each value's best); with
runs of two sizes or more the view across sizes (scaling.md/.csv, scaling_gap and
scaling_loss as PNG/SVG), one index.html.

Reads MLflow only (through ddl.track.query). Written into a temporary sibling directory and
swapped into place, so a reader never sees half a report.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..validation import safe_name
from . import render
from . import transfer
from .compute import check_measure
from .figures import layer_diagnostics, loss_curves, sensitivity
from .scaling import CrossSize, cross_size
from .scaling_figures import gap_figure, loss_figure
from .tables import Table, accuracy_table, deltaproduct_table, evaluated, json_object, loss_table, variant_rows
from .tuning import best_runs, tuned_note, tuned_table

SIZE_ORDER = ["small", "medium", "large", "mini", "tiny", "micro"]


@dataclass
class Report:
    experiment: str
    path: Path
    tables: list[Table]
    runs: pd.DataFrame
    unit: str
    across: CrossSize | None = None   # the view across sizes, with finished runs of two sizes or more
    transfer: pd.DataFrame | None = None   # the best lr along one axis (ddl.report.transfer), where the runs have one


def _sizes(runs: pd.DataFrame) -> list[str]:
    found = list(dict.fromkeys(runs["params.model.size"]))
    return sorted(found, key=lambda s: (SIZE_ORDER.index(s) if s in SIZE_ORDER else len(SIZE_ORDER), s))


def _unit(runs: pd.DataFrame) -> str:
    units = sorted(set(runs.get("tags.ddl.loss_unit", pd.Series(dtype=str)).dropna()))
    return " / ".join(units) if units else "nats/token"


def build(experiment: str, runs: pd.DataFrame, histories: pd.DataFrame, out_root: Path,
          searches: pd.DataFrame | None = None, measure: str = "flops") -> Report:
    """The report of one experiment; its verdicts at equal compute in `measure` (ddl.costs.COMPUTE_MEASURES), which
    must price every row (ddl.report.compute.UnknownCost, before anything is written)."""
    runs = runs.assign(row=variant_rows(runs))
    check_measure(runs, measure)
    sizes, unit = _sizes(runs), _unit(runs)
    searches = pd.DataFrame() if searches is None else searches
    tables = [loss_table(runs, sizes, unit, histories, measure)]
    tables += [t for t in [tuned_table(runs, searches, sizes, unit, histories, measure)] if t is not None]
    tables += [t for t in [deltaproduct_table(runs, sizes, unit)] if t is not None]
    for shots, tasks in evaluated(runs):
        tables += [accuracy_table(runs, size, shots, tasks) for size in sizes]
    final = out_root / safe_name("experiment", experiment)    # a folder of out_root's own, never beyond it
    out_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{experiment}.", dir=out_root))
    figures = []
    for size in sizes:
        drawn = loss_curves(runs, histories, size, unit, staging) + layer_diagnostics(runs, size, staging) + \
            sensitivity(runs, size, unit, staging)
        figures += [f for f in drawn if f.endswith(".png")]
    transferred, drawn = transfer.write(runs, unit, staging)
    figures += [f for f in drawn if f.endswith(".png")]
    view = _view(runs, searches, tables, sizes, unit)
    across = _across_sizes(view, staging)
    for table in tables:
        (staging / f"{table.name}.md").write_text(render.markdown(table))
        (staging / f"{table.name}.tex").write_text(render.latex(table))
        (staging / f"{table.name}.csv").write_text(render.csv_text(table))
    counts = runs["status"].value_counts().to_dict()
    summary = f"{len(runs)} runs ({', '.join(f'{n} {s}' for s, n in counts.items())}); losses in {unit}."
    (staging / "index.html").write_text(render.html_page(experiment, tables, figures, summary, across))
    (staging / "README.md").write_text(f"# ddl report: {experiment}\n\n{summary}\n\n" +
                                       "\n".join(render.markdown(t) for t in tables) +
                                       ("\n" + (staging / "scaling.md").read_text() if across else ""))
    os.chmod(staging, 0o755)
    if final.exists():
        old = final.with_name(f".{experiment}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old)
    else:
        os.replace(staging, final)
    return Report(experiment, final, tables, runs, unit, view, transferred)


def _view(runs: pd.DataFrame, searches: pd.DataFrame, tables: list[Table], sizes: list[str], unit: str):
    """The view across sizes: of the loss table; where a search ran, of each row at its own best (a search's runs
    at its best values, every row paired with its tuned baseline)."""
    if not any(t.name == "tuned" for t in tables):
        return cross_size(runs, tables[0], sizes, unit)
    best = best_runs(runs, searches)
    searched = {f"params.{key}" for values in searches.get("tags.ddl.best_values", []) for key in json_object(values)}
    best = best.assign(row=variant_rows(best.drop(columns=[c for c in searched if c in best])))  # replicates: one row
    return cross_size(best, loss_table(best, sizes, unit), sizes, unit, tuned_note(searches))


def _across_sizes(view: CrossSize | None, staging: Path) -> str:
    """scaling.md/.csv and the two figures of the view across sizes; their HTML section ("" without a view,
    i.e. with one size: no file is written)."""
    if view is None:
        return ""
    figures = gap_figure(view, staging) + loss_figure(view, staging)
    (staging / "scaling.md").write_text(render.scaling_markdown(view))
    (staging / "scaling.csv").write_text(render.scaling_csv(view))
    return render.scaling_html(view, figures)
