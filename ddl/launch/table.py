"""What the terminal shows for a sweep: the plan (dry run), one live line per job, the summary."""

from __future__ import annotations

import contextlib
import sys
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from .. import paths
from ..costs import ASSUMED_MFU, BF16_PEAK_FLOPS
from . import status

console = Console(width=None if sys.stdout.isatty() else 160)  # logs keep whole columns


class _Printable:
    def __init__(self, table: Table):
        self.table = table

    def print(self) -> None:
        console.print(self.table)


def job_table(jobs, estimate) -> _Printable:
    table = Table(title="ddl-run: planned jobs (dry run, nothing launched)")
    for column in ("signature", "job", "overrides", "params", "tokens", "GPU-h*"):
        table.add_column(column, justify="right" if column in ("params", "tokens", "GPU-h*") else "left")
    total = 0.0
    for job in jobs:
        n_params, tokens, gpu_hours = estimate(job)
        total += gpu_hours
        table.add_row(job.signature, job.name, " ".join(job.overrides), f"{n_params / 1e6:.2f}M", f"{tokens:.3g}",
                      f"{gpu_hours:.3g}")
    table.caption = (f"* 6·N·tokens FLOPs at {ASSUMED_MFU:.0%} of an H100's bf16 peak "
                     f"({BF16_PEAK_FLOPS['H100'] / 1e12:.0f} TFLOP/s); total {total:.3g} GPU-h. "
                     f"{len(jobs)} jobs.")
    return _Printable(table)


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _eta(seconds) -> str:
    return "" if seconds is None else time.strftime("%H:%M:%S", time.gmtime(seconds))


def _live(jobs, job_ids: dict[str, str]) -> Table:
    table = Table(title="ddl-run sweep")
    for column in ("job", "signature", "state", "step", "train loss", "val loss", "tok/s", "ETA", "id"):
        table.add_column(column)
    for job in jobs:
        s = status.read(paths.runs_dir() / job.signature)
        table.add_row(job.name, job.signature, s.get("state", "queued"), f"{s.get('step', 0)}/{job.run.train.steps}",
                      _fmt(s.get("train_loss"), ".4f"), _fmt(s.get("val_loss"), ".4f"),
                      _fmt(s.get("tokens_per_s"), ",.0f"), _eta(s.get("eta_s")), job_ids.get(job.signature, ""))
    return table


@contextlib.contextmanager
def live_table(jobs):
    """Refreshed in place on a terminal; printed once at the end where output is a file."""
    job_ids: dict[str, str] = {}
    with Live(_live(jobs, job_ids), console=console, refresh_per_second=2, transient=False) as live:
        def refresh(running_ids: dict[str, str]) -> None:
            job_ids.update(running_ids)
            live.update(_live(jobs, job_ids))
        yield refresh
        refresh({})
    console.print()


def summary_table(rows) -> _Printable:
    table = Table(title="ddl-run: summary")
    for column in ("job", "signature", "result", "detail"):
        table.add_column(column)
    style = {"finished": "green", "skipped": "cyan", status.ELSEWHERE: "yellow"}
    for job, state, detail in rows:
        table.add_row(job.name, job.signature, f"[{style.get(state, 'red')}]{state}[/]", detail)
    counts = {s: sum(r[1] == s for r in rows) for s in ("finished", "skipped", status.ELSEWHERE)}
    table.caption = (f"{counts['finished']} finished, {counts['skipped']} skipped, "
                     f"{len(rows) - sum(counts.values())} failed or stopped"
                     + (f", {counts[status.ELSEWHERE]} {status.ELSEWHERE}" if counts[status.ELSEWHERE] else ""))
    return _Printable(table)
