"""What the terminal shows: a sweep's plan (dry run), its live table and summary, and one run's progress.

Tables fit the console's width (COLUMNS, else the terminal's; 160 where output is a file): the
least needed columns are dropped first, and what still does not fit wraps, never cut to "...".
Where output is not a terminal, a live table would show nothing until the end: instead, one plain
line per running job every DDL_PROGRESS_S seconds (default 30).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .. import paths
from ..costs import recorded
from ..text import PROGRESS_DEFAULT_S, PROGRESS_ENV, duration, plural
from . import status
from .configs import env_seconds
from .estimate import CPU_TRAIN_FLOPS, job_cost, wall_seconds

console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)  # logs keep whole columns
STYLES = {"finished": "green", status.REUSED: "cyan", "skipped": "cyan", "running": "bold", "queued": "dim",
          status.ELSEWHERE: "yellow", "failed": "red", "killed": "red", status.LOST: "red", "pruned": "magenta"}


def progress_seconds() -> float:
    """Seconds between progress lines where output is not a terminal (DDL_PROGRESS_S); one line if bad."""
    return env_seconds(PROGRESS_ENV, PROGRESS_DEFAULT_S)


@dataclass(frozen=True)
class Column:
    header: str
    drop: int = 0            # 0: always shown; else dropped, highest first, until the table fits
    right: bool = False


def fitted(title: str, columns: list[Column], rows: list[list], caption: str | None = None) -> Table:
    """The table with as many of its columns as fit the console's width (cells are plain text or Text)."""
    keep = list(range(len(columns)))
    droppable = sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop)
    while True:
        table = Table(title=title, caption=caption, caption_justify="left")
        for i in keep:
            table.add_column(columns[i].header, justify="right" if columns[i].right else "left", overflow="fold")
        for row in rows:
            table.add_row(*(row[i] if isinstance(row[i], Text) else Text(str(row[i])) for i in keep))
        natural = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
        if not droppable or natural <= console.width:
            return table
        keep.remove(droppable.pop(0))


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def state_text(fields: dict, default: str = "queued") -> Text:
    """A job's state as the tables show it: `reused (from experiment X)` for a reused one, and what its
    store did meanwhile (`running; MLflow unreachable ...`)."""
    state = fields.get("state", default)
    shown = status.reused(fields["reused_from"]) if state == status.REUSED and fields.get("reused_from") else state
    if fields.get("note"):
        shown += f"; {fields['note']}"
    return Text(shown, style=STYLES.get(state, ""))


def progress_line(name: str, fields: dict) -> str:
    """`name: step 120/300, train loss 3.2100, val loss 3.3012, 7,399 tok/s, ETA 00:02:10`."""
    parts = [f"step {fields.get('step', 0)}/{fields.get('steps', '?')}"]
    parts += [f"{label} {fields[key]:.4f}" for key, label in (("train_loss", "train loss"), ("val_loss", "val loss"))
              if fields.get(key) is not None]
    if fields.get("tokens_per_s") is not None:
        parts.append(f"{fields['tokens_per_s']:,.0f} tok/s")
    if fields.get("eta_s") is not None:
        parts.append(f"ETA {duration(fields['eta_s'])}")
    if fields.get("note"):
        parts.append(fields["note"])
    return f"{name}: {', '.join(parts)}"


class _Printable:
    def __init__(self, table: Table):
        self.table = table

    def print(self) -> None:
        console.print(self.table)


# -- the plan (dry run) -----------------------------------------------------------------------
def _overrides(jobs) -> tuple[list[str], list[str]]:
    """(the overrides every job has, each job's others); dry_run=... is the title's."""
    per_job = [[o for o in job.overrides if not o.startswith("dry_run=")] for job in jobs]
    shared = [o for o in per_job[0] if all(o in own for own in per_job[1:])] if per_job else []
    return shared, [" ".join(o for o in own if o not in shared) for own in per_job]


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:,.0f}" if minutes >= 10 else f"{minutes:.2g}"


def _graphs_memory(costs, figures: dict) -> str:
    """What GiB/GPU counts for jobs under CUDA graphs: the pool measured in training runs with graphs, or that none
    was."""
    if not any(c.graphs and c.cpu_seconds is None for c in costs):
        return ""
    ratio = figures.get("graphs_peak_over_saved")
    if ratio is None:
        return ("; under CUDA graphs (train.compile_mode=reduce-overhead) the graphs' memory pool is not measured yet "
                "(make gpu-check's train part): priced as without")
    return f"; under CUDA graphs, {ratio:.2f}x them, as training runs with graphs measured (their pool included)"


def _cost_caption(costs, to_run: list[bool], slots: int, threads: int) -> str:
    """What the cost columns assume, and the totals of the jobs to run: GPU-hours where jobs get GPUs,
    core-minutes (and the wall time on the launcher's slots) where they train on CPU."""
    gpu = [c.gpu_hours for c, run in zip(costs, to_run, strict=True) if c.cpu_seconds is None and run]
    cpu = [c.cpu_seconds for c, run in zip(costs, to_run, strict=True) if c.cpu_seconds is not None and run]
    caption = []
    if any(c.cpu_seconds is None for c in costs):
        g = recorded()["gpu"]
        caption.append(f"* the baseline's 6·N FLOPs a token at the MFU `make gpu-check` measured "
                       f"({g['baseline_mfu']:.1%}, {g['card']}, {g['date']}), times the step ratio it measured for "
                       f"d_v=1 and d_v=4 ({', '.join(f'{r:.2f}' for r in g['step_ratios'].values())}), other "
                       f"variants adding the memory traffic they move beyond those (ddl.traffic, counted) at "
                       f"{g['copy_bytes_per_s'] / 1e12:.1f} TB/s; to run: {sum(gpu):.3g} GPU-h. GiB/GPU: weights "
                       f"and AdamW state, and the activations a micro-batch saves{_graphs_memory(costs, g)}.")
    if any(c.cpu_seconds is not None for c in costs):
        wall = wall_seconds(cpu, slots, threads) if cpu else 0.0
        caption.append(f"† training on CPU: 6·N·tokens FLOPs at {CPU_TRAIN_FLOPS / 1e9:.2g} GFLOP/s per core, "
                       f"measured, plus each job's start-up and evaluation (ddl/launch/estimate.py); to run: "
                       f"{_minutes(sum(cpu))} core-min, about {_minutes(wall)} min wall with {plural(slots, 'job')} "
                       f"at once x {plural(threads, 'thread')}.")
    return " ".join(caption)


CHECKPOINT_BYTES_PER_PARAM = 12      # fp32 weights and AdamW's two moments


def _checkpoint_caption(jobs, costs, to_run: list[bool]) -> str:
    """What the jobs to run upload to the store: one checkpoint artifact each (train.checkpoint_artifact)."""
    sizes = [cost.params * CHECKPOINT_BYTES_PER_PARAM for job, cost, run in zip(jobs, costs, to_run, strict=True)
             if run and job.run.train.checkpoint_artifact != "none"]
    if not sizes:
        return ""
    policies = sorted({job.run.train.checkpoint_artifact for job in jobs})
    return (f"Checkpoint artifacts: ~{max(sizes) / 1e6:,.0f} MB per job, ~{sum(sizes) / 1e9:.3g} GB in all "
            f"(train.checkpoint_artifact={','.join(policies)}: one per run, replaced at each upload; "
            f"final uploads only the last, none nothing).")


def job_table(jobs, gpus: int, slots: int, threads: int, data=((), "")) -> _Printable:
    """The plan: each job's name, whether it is done already (finished here, or to be reused from another
    experiment), the overrides that tell it from the others, and its cost: GPU-hours on an H100 where
    the launcher gives GPUs, core-minutes on CPU (and the sweep's wall time on `slots` parallel jobs
    of `threads` threads). `data`: the datasets to prepare first (ddl.launch.data_jobs.plan): a row per
    prepare job (name, where and how long, tokens), and the caption's sentence."""
    preparing, data_caption = data
    from .plan import already_done
    done = already_done(jobs)
    costs = [job_cost(job, gpus) for job in jobs]
    shared, own = _overrides(jobs)
    gpu, cpu = any(c.cpu_seconds is None for c in costs), any(c.cpu_seconds is not None for c in costs)
    columns = [Column("job"), Column("status"), Column("overrides", 4), Column("params", 5, True),
               Column("tokens", 3, True), Column("GPU-h*", 0, True), Column("GiB/GPU*", 0, True),
               Column("CPU core-min†", 0, True), Column("signature", 6)]
    shown = [True, True, any(own), True, True, gpu, gpu, cpu, True]
    rows = [[job.name, Text(done[job.signature], "cyan") if job.signature in done else "to run", others,
             f"{cost.params / 1e6:.2f}M", f"{cost.tokens:.3g}",
             f"{cost.gpu_hours:.3g}" if cost.cpu_seconds is None else "",
             f"{cost.gpu_memory / 2 ** 30:.0f}" if cost.cpu_seconds is None else "",
             "" if cost.cpu_seconds is None else f"{cost.cpu_seconds / 60:.1f}", job.signature]
            for job, cost, others in zip(jobs, costs, own, strict=True)]
    rows = [[f"prepare {name}", Text(how, "yellow"), "", "", f"{tokens:.3g}", *[""] * (len(columns) - 5)]
            for name, how, tokens in preparing] + rows
    to_run = [job.signature not in done for job in jobs]
    caption = " ".join(filter(None, [f"Every job: {' '.join(shared)}." if shared and len(jobs) > 1 else "",
                                     _cost_caption(costs, to_run, slots, threads),
                                     _checkpoint_caption(jobs, costs, to_run),
                                     data_caption,
                                     f"{plural(len(jobs), 'job')}, {sum(to_run)} to run."]))
    title = "ddl-run: planned jobs (dry run, nothing launched)" + (f": {' '.join(shared)}" if len(jobs) == 1 and shared
                                                                    else "")
    return _Printable(fitted(title, [c for c, s in zip(columns, shown, strict=True) if s],
                             [[v for v, s in zip(row, shown, strict=True) if s] for row in rows], caption))


# -- a search (ddl.launch.tuning) -------------------------------------------------------------------
def search_plan_table(rows, tuning, launcher, data: str = "") -> _Printable:
    """A search's dry run: per row its space, trials (or the size it is carried from), replicates and seeds, and its
    cost at most (every trial and bracket trial trained to its end, every seed of the plan run); pruning and seeds
    that resolve early only lower it. `data`: the datasets prepared first (ddl.launch.data_jobs.search_sentence)."""
    gpus, cpus = launcher.params.get("gpus_per_node") or 0, launcher.params.get("cpus_per_task") or 1
    firsts = [row for row in rows if row.replicate == 0]
    slots = launcher.bound(len(rows) * tuning.trials)
    runs = [tuning.replicates * (tuning.seed_plan[-1] + (0 if row.source else tuning.trials + tuning.bracket_trials))
            for row in firsts]
    costs = [job_cost(row.job, gpus) for row in firsts]
    cpu = [c.cpu_seconds * n for c, n in zip(costs, runs, strict=True) if c.cpu_seconds is not None]
    gpu = sum(c.gpu_hours * n for c, n in zip(costs, runs, strict=True) if c.cpu_seconds is None)
    columns = [Column("row"), Column("search", 5), Column("searched", 3), Column("trials", right=True),
               Column("replicates", 4, True), Column("seeds", 2, True), Column("runs at most", 1, True),
               Column("cost at most", 4, True)]
    seeds = "auto: " + ", ".join(map(str, tuning.seed_plan)) if tuning.seeds == "auto" else tuning.seeds
    table_rows = [[row.name, row.search, " ".join(d.spec() for d in row.space),
                   row.carried or f"{tuning.trials} + {tuning.bracket_trials} bracket", str(tuning.replicates), seeds,
                   str(n),
                   f"{_minutes(c.cpu_seconds * n)} core-min" if c.cpu_seconds is not None else
                   f"{c.gpu_hours * n:.3g} GPU-h"] for row, c, n in zip(firsts, costs, runs, strict=True)]
    wall = f", about {_minutes(wall_seconds(cpu, slots, cpus))} min wall on {plural(slots, 'slot')}" if cpu else ""
    carried = sum(row.source is not None for row in firsts)
    searched = (f"{plural(len(firsts) - carried, 'row')} searched at {tuning.search_size}, {carried} carried from "
                f"there (its row's best values, at fresh seeds: no trials of their own)" if tuning.search_size
                else plural(len(firsts), 'row'))
    at_once = min(tuning.parallel or launcher.bound(len(rows) - carried), tuning.trials)
    caption = (f"{searched}, each searched {plural(tuning.replicates, 'time')} independently (a replicate: its own "
               f"TPE draws and seeds); at most {plural(sum(runs), 'job')}: " +
               ", ".join(filter(None, [cpu and f"{_minutes(sum(cpu))} core-min{wall}", gpu and f"{gpu:.3g} GPU-h"])) +
               f". Trials {at_once} at a time per search, pruner {tuning.pruner} (never beside the best); each "
               f"replicate's best at fresh seeds, paired with the tuned baseline's replicate (alpha {tuning.alpha}).")
    caption = " ".join(filter(None, [caption, data]))
    return _Printable(fitted("ddl-run: planned search (dry run, nothing launched)", columns, table_rows, caption))


def search_result_table(rows, looks: dict, baseline_of, replicates_of) -> _Printable:
    """Each row over its replicates: the best values each found, the row's loss (the mean over replicates of each
    one's mean over its fresh seeds, with its 95% interval over replicates), and its gap to the tuned baseline with
    the interval of the look that ended it."""
    from ..stats import mean_interval
    from ..tune.workflow import NOT_BRACKETED, verdict
    columns = [Column("row"), Column("best values", 3), Column("val loss at its optimum [95% CI]", right=True),
               Column("seeds", 4, True), Column("vs tuned baseline", right=True), Column("verdict", 2),
               Column("search", 5)]
    table_rows = []
    for first in (row for row in rows if row.replicate == 0):
        replicas = replicates_of(first, rows)
        found, base = looks.get(first.search), baseline_of(first, rows)
        means = [m for r in replicas if r.seeds and math.isfinite(m := sum(r.seeds.values()) / len(r.seeds))]
        estimate = mean_interval(means)
        loss = "" if estimate is None else f"{estimate.mean:.4f}" + (
            f" [{estimate.low:.4f}, {estimate.high:.4f}]" if estimate.low is not None else "")
        diff = found.difference if found else None
        gap = "" if diff is None or diff.relative is None else f"{diff.relative:+.1f}%"
        if diff is not None and diff.low is not None:
            gap += f" [{100 * diff.low / abs(diff.reference):+.1f}, {100 * diff.high / abs(diff.reference):+.1f}]"
        bracketed = all(r.bracketed for r in replicas)
        said = verdict(found, bracketed) if base is not None else (NOT_BRACKETED if not bracketed else "(baseline)")
        values = "; ".join(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.best.items())
                           + (f" (not bracketed: {', '.join(r.open)})" if r.open else "") for r in replicas)
        values += f" ({first.carried})" if first.source else ""
        seeds = "/".join(str(len(r.seeds)) for r in replicas)
        table_rows.append([first.name, values, loss, seeds, gap, said, first.search])
    caption = ("Each row searched once per replicate; its loss: each replicate's best at fresh seeds (never the seed "
               "that selected it), the interval over replicates, which carries the search's luck; the gap: paired by "
               "replicate, at the confidence of the look that ended the row (ddl.tune.sequential). ddl-report adds "
               "the verdict at equal compute and the sensitivity curves.")
    return _Printable(fitted("ddl-run: tuned rows", columns, table_rows, caption))


# -- a sweep ----------------------------------------------------------------------------------
LIVE_COLUMNS = [Column("job"), Column("state"), Column("step", right=True), Column("train loss", 2, True),
                Column("ETA", 3, True), Column("tok/s", 4, True), Column("val loss", 5, True), Column("signature", 6)]


def _live(jobs, job_ids: dict[str, str], id_header: str | None) -> Table:
    columns = LIVE_COLUMNS + [Column(id_header, 7)] * bool(id_header)
    rows = []
    for job in jobs:
        s = status.read(paths.runs_dir() / job.signature)
        rows.append([job.name, state_text(s), f"{s.get('step', 0)}/{job.run.train.steps}",
                     _fmt(s.get("train_loss"), ".4f"), duration(s.get("eta_s")), _fmt(s.get("tokens_per_s"), ",.0f"),
                     _fmt(s.get("val_loss"), ".4f"), job.signature, job_ids.get(job.signature, "")][:len(columns)])
    return fitted("ddl-run sweep", columns, rows)


@contextlib.contextmanager
def live_table(jobs, id_header: str | None = None):
    """A table redrawn in place on a terminal (with the cluster's job ids under `id_header`); where
    output is a file, a line per job when its state changes and every DDL_PROGRESS_S seconds while
    it runs. Yields refresh(job ids of the running jobs)."""
    if not console.is_terminal:
        refresh = _progress_lines(jobs, progress_seconds())
        yield refresh
        refresh({})          # the states the last poll did not see
        return
    job_ids: dict[str, str] = {}
    with Live(_live(jobs, job_ids, id_header), console=console, refresh_per_second=2, transient=False) as live:
        def refresh(running_ids: dict[str, str]) -> None:
            job_ids.update(running_ids)
            live.update(_live(jobs, job_ids, id_header))
        yield refresh
        refresh({})
    console.print()


def _progress_lines(jobs, every_s: float):
    """refresh() for output that is not a terminal: a job's line when its state changes, and every
    `every_s` seconds while it runs."""
    started = time.monotonic()
    shown = {job.signature: ((status.read(paths.runs_dir() / job.signature).get("state", "queued"), None), started)
             for job in jobs}      # signature -> ((state, note), when) of its last line

    def refresh(_running_ids: dict[str, str]) -> None:
        now = time.monotonic()
        for job in jobs:
            s = status.read(paths.runs_dir() / job.signature)
            state, (last_state, last) = (s.get("state", "queued"), s.get("note")), shown[job.signature]
            if state != last_state or (state[0] == "running" and now - last >= every_s):
                shown[job.signature] = (state, now)
                line = progress_line(f"{job.name} [{job.signature}]", s) if state[0] == "running" \
                    else f"{job.name} [{job.signature}]: {state_text(s)}"
                print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)
    return refresh


def summary_table(rows) -> _Printable:
    """rows: (job, state, detail, reused_from or None)."""
    table_rows = [[job.name, state_text({"state": state, "reused_from": source}), detail, job.signature]
                  for job, state, detail, source in rows]
    counted = ("finished", status.REUSED, "skipped", status.ELSEWHERE, "pruned")
    counts = {s: sum(r[1] == s for r in rows) for s in counted}
    sources = sorted({source for _, state, _, source in rows if state == status.REUSED and source})
    reused = f"{counts[status.REUSED]} reused (from experiment {', '.join(sources)}), " if sources else ""
    pruned = f"{counts['pruned']} pruned, " if counts["pruned"] else ""
    caption = (f"{counts['finished']} finished, {reused}{counts['skipped']} skipped, {pruned}"
               f"{len(rows) - sum(counts.values())} failed or stopped"
               + (f", {counts[status.ELSEWHERE]} {status.ELSEWHERE}" if counts[status.ELSEWHERE] else ""))
    columns = [Column("job"), Column("result"), Column("detail"), Column("signature", 1)]
    return _Printable(fitted("ddl-run: summary", columns, table_rows, caption))


# -- one run ------------------------------------------------------------------------------------
class ProgressLogger:
    """The console's MetricLogger for one run: on a terminal one line redrawn in place; elsewhere that
    line at the first and last logged step and every DDL_PROGRESS_S seconds in between."""

    def __init__(self, name: str, total_steps: int):
        self.name, self.progress, self.every_s = name, status.Progress(total_steps), progress_seconds()
        self.live: Live | None = None
        self.last: float | None = None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        line = progress_line(self.name, self.progress.update(metrics, step))
        if console.is_terminal:
            if self.live is None:
                self.live = Live(Text(line), console=console, auto_refresh=False)
                self.live.start()
            self.live.update(Text(line), refresh=True)
        elif self.last is None or step >= self.progress.total or time.monotonic() - self.last >= self.every_s:
            self.last = time.monotonic()
            print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
