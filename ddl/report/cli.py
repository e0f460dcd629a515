"""`ddl-report [--experiment NAME ...] [--out DIR] [--docs DIR]`: the paper's tables and Figure 2 from MLflow; with
--docs, each experiment's tables also as DIR/<experiment>.md, the form docs/results/ quotes (never typed by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import paths
from ..text import plural
from ..validation import OneLineParser


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="ddl-report", description=__doc__)
    parser.add_argument("--experiment", nargs="+", help="MLflow experiments (default: every one with ddl runs)")
    parser.add_argument("--out", type=Path, default=None, help="report root (default: reports/ of the checkout)")
    parser.add_argument("--compute", default="flops", metavar="MEASURE",
                        help="the verdict at equal compute in: flops (training FLOPs, default), cpu or h100 (the "
                             "step times the bench recorded there, ddl/costs.py)")
    parser.add_argument("--docs", type=Path, default=None, metavar="DIR",
                        help="also write each experiment's tables as DIR/<experiment>.md (e.g. docs/results)")
    args = parser.parse_args(argv)
    try:
        return _report(args.experiment, args.out, args.compute, args.docs)
    except (ValueError, OSError) as err:   # a bad name or --out, a store that cannot be read
        detail = f"{err.filename}: {err.strerror}" if isinstance(err, OSError) and err.strerror else err
        print(f"ddl-report: error: {detail}")
        return 2


def _report(names: list[str] | None, out: Path | None, measure: str = "flops", docs: Path | None = None) -> int:
    from rich.console import Console

    from ..track import store
    from ..track.query import ddl_experiments, load_histories, load_runs, load_searches
    from ..validation import safe_name
    from .build import build
    from .compute import check_measure

    names = [safe_name("--experiment", name) for name in names or []]
    experiments = names or ([name for name in ddl_experiments() if _reportable(name)] if store.exists() else [])
    if not experiments:
        print(f"ddl-report: no ddl runs in {paths.tracking_uri()}; run `ddl-run` or `make demo` first")
        return 1
    console = Console(width=None if sys.stdout.isatty() else 160)   # logs keep whole columns
    found = {}
    for experiment in experiments:
        runs = load_runs(experiment) if store.exists() else None     # reading creates no store
        if runs is None or runs.empty:
            print(f"ddl-report: error: experiment={experiment!r}: no ddl runs there")
            return 2
        check_measure(runs, measure)                # a measure that cannot price a row: before any report is written
        found[experiment] = runs
    if docs is not None:
        docs.mkdir(parents=True, exist_ok=True)     # a --docs that cannot be made: refused before any report
    for experiment, runs in found.items():
        histories = load_histories(list(runs["run_id"]), ["train/loss", "val/loss"])
        report = build(experiment, runs, histories, out or paths.reports_dir(), load_searches(experiment), measure)
        _print_summary(console, experiment, report)
        if docs is not None:
            _write_docs(docs, experiment, report, measure)
    return 0


def _write_docs(docs: Path, experiment: str, report, measure: str) -> None:
    """The report's tables as one Markdown page for docs/, saying the command that wrote it."""
    command = f"ddl-report --experiment {experiment} --docs {docs}" + (f" --compute {measure}" if measure != "flops"
                                                                      else "")
    tables = (report.path / "README.md").read_text().split("\n", 1)[1]
    paths.write_atomic(docs / f"{experiment}.md", f"# {experiment}\n\nWritten by `{command}` from the store; "
                                                  f"run it again rather than edit this page.\n{tables}")
    print(f"docs: {docs / f'{experiment}.md'}")


def _print_summary(console, experiment: str, report) -> None:
    """What the console shows of a written report: the final losses, the comparisons with the baseline and
    the paper, the marks' notes, a search's tuned rows, the gaps across sizes (measured and fitted), the best lr
    along a transfer study's axis, and where the report is."""
    from .render import compared, ours
    from .scaling import sections
    from .tables import row_label

    loss = report.tables[0]
    columns = loss.columns[::2]
    shown = []
    for row in loss.rows:
        cells = [loss.cells[row, col.key] for col in columns]
        if any(c.mean is not None or c.marker != "—" for c in cells):
            shown.append([row_label(row), *map(ours, cells)])
    title = f"{experiment}: final validation loss ({report.unit})"
    console.print(_table(title, ["model", *(col.header for col in columns)], shown))
    for heading, headers, table_rows in compared(loss):
        console.print(_table(heading, headers, table_rows))
    for mark, text in loss.marks().items():
        console.print(f"{mark} {text}")
    for tuned in (t for t in report.tables if t.name == "tuned"):     # a search's rows, each at its own best
        per_size = list(compared(tuned))
        for i, (heading, headers, table_rows) in enumerate(per_size):
            console.print(_table(heading, headers, table_rows, caption=tuned.note if i == len(per_size) - 1 else None))
    if report.across is not None:
        for title, headers, table_rows, note in sections(report.across)[::2]:   # the gaps, measured and fitted
            console.print(_table(title, headers, table_rows, caption=note))
    if report.transfer is not None:
        from . import transfer
        title = f"{experiment}: the best learning rate along {report.transfer['axis'].iloc[0]}"
        console.print(_table(title, transfer.HEADERS, transfer.rows(report.transfer),
                             caption="\n".join(transfer.summaries(report.transfer))))
    console.print(f"report: {report.path / 'index.html'}  ({plural(len(report.tables), 'table')}, "
                  f"{plural(len(list(report.path.glob('*.png'))), 'figure')})")


def _table(title: str, headers, rows, caption: str | None = None):
    from rich.table import Table
    table = Table(title=title, caption=caption)
    for header in headers:
        table.add_column(header)
    for row in rows:
        table.add_row(*row)
    return table


def _reportable(name: str) -> bool:
    """An experiment whose name can be a folder of its own; the others are named and left out."""
    from ..validation import safe_name
    try:
        safe_name("experiment", name)
        return True
    except ValueError as err:
        print(f"ddl-report: skipped: {err}")
        return False
