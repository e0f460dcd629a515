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
from .estimate import CPU_TRAIN_FLOPS, job_cost, wall_seconds

console = Console(width=None if sys.stdout.isatty() else 160)  # logs keep whole columns


class _Printable:
    def __init__(self, table: Table):
        self.table = table

    def print(self) -> None:
        console.print(self.table)


def job_table(jobs, gpus: int, slots: int, threads: int) -> _Printable:
    """The plan with each job's cost: GPU-hours on an H100 and, for jobs that train on CPU, core-minutes
    (and the sweep's wall time on `slots` parallel jobs of `threads` threads)."""
    costs = [job_cost(job, gpus) for job in jobs]
    on_cpu = [c.cpu_seconds for c in costs if c.cpu_seconds is not None]
    table = Table(title="ddl-run: planned jobs (dry run, nothing launched)")
    columns = ["signature", "job", "overrides", "params", "tokens", "GPU-h*"] + ["CPU core-min†"] * bool(on_cpu)
    for column in columns:
        table.add_column(column, justify="left" if column in ("signature", "job", "overrides") else "right")
    for job, cost in zip(jobs, costs, strict=True):
        cpu = [f"{cost.cpu_seconds / 60:.1f}" if cost.cpu_seconds is not None else "GPU"] * bool(on_cpu)
        table.add_row(job.signature, job.name, " ".join(job.overrides), f"{cost.params / 1e6:.2f}M",
                      f"{cost.tokens:.3g}", f"{cost.gpu_hours:.3g}", *cpu)
    caption = (f"* 6·N·tokens FLOPs at {ASSUMED_MFU:.0%} of an H100's bf16 peak "
               f"({BF16_PEAK_FLOPS['H100'] / 1e12:.0f} TFLOP/s); total {sum(c.gpu_hours for c in costs):.3g} GPU-h.")
    if on_cpu:
        wall = wall_seconds(on_cpu, slots, threads)
        caption += (f" † on CPU (this launcher gives no GPU): 6·N·tokens FLOPs at {CPU_TRAIN_FLOPS / 1e9:.2g} GFLOP/s "
                    f"per core, measured, plus each job's start-up and evaluation (ddl/launch/estimate.py); total "
                    f"{sum(on_cpu) / 60:.0f} core-min, about {wall / 60:.0f} min wall with {slots} job(s) at once x "
                    f"{threads} thread(s).")
    table.caption = f"{caption} {len(jobs)} jobs."
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
