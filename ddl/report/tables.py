"""The paper's tables rebuilt from runs: cells with mean ± std over seeds, the paper's value and
our delta, best bold / second underlined, and explicit markers where a run is missing or failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources

import pandas as pd

from ..eval.suites import PAPER_TASKS

PAPER_ROWS = {"baseline": "Baseline", "ddl_dv1": "DDL (d_v=1)", "ddl_dv4": "DDL (d_v=4)",
              "ddl_dv4_cc": "DDL-CC", "ddl_dv4_ec": "DDL-EC", "ddl_dv4_cc_ec": "DDL-CC-EC"}
TASK_HEADERS = {"arc_challenge": "ARC-C", "arc_easy": "ARC-E", "hellaswag": "Hellaswag", "openbookqa": "OpenBookQA",
                "piqa": "PIQA", "sciq": "SciQ", "social_iqa": "Social IQA", "winogrande": "WG", "average": "Avg."}
ACCURACY_TABLES = {("small", 1): "table1", ("medium", 1): "table2", ("small", 0): "table5", ("medium", 0): "table6"}
NO_RUN, FAILED, RUNNING = "—", "FAILED", "running"


@dataclass
class Cell:
    mean: float | None = None
    std: float | None = None
    n: int = 0
    marker: str | None = None       # NO_RUN / FAILED / RUNNING when there is no finished value
    paper: float | None = None
    rank: int = 0                    # 1 best, 2 second best in its column

    @property
    def delta(self) -> float | None:
        return None if self.mean is None or self.paper is None else self.mean - self.paper


@dataclass
class Column:
    key: str
    header: str
    higher_is_better: bool


@dataclass
class Table:
    name: str
    title: str
    rows: list[str]
    columns: list[Column]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    note: str = ""

    def rank(self) -> None:
        """Best value(s) rank 1, the next distinct value rank 2: ties share their rank."""
        for col in self.columns:
            cells = [c for row in self.rows if (c := self.cells[row, col.key]).mean is not None]
            distinct = sorted({round(c.mean, 10) for c in cells}, reverse=col.higher_is_better)
            for c in cells:
                place = distinct.index(round(c.mean, 10)) + 1
                c.rank = place if place <= 2 else 0


def paper_values() -> pd.DataFrame:
    return pd.read_csv(resources.files("ddl.report").joinpath("paper_tables.csv").open())


def row_label(row: str) -> str:
    """'ddl_dv1 beta_init=0.5' -> 'DDL (d_v=1) beta_init=0.5'."""
    base, _, settings = row.partition(" ")
    return " ".join(filter(None, (PAPER_ROWS.get(base, base), settings)))


NOT_SETTINGS = {"params.seed", "params.model.size", "params.model.row"}
NOT_LOGGED = "(not logged)"   # a setting the run's code did not have yet: it ran that code's default


def variant_rows(runs: pd.DataFrame) -> pd.Series:
    """Each run's table row: its paper row, plus the settings in which it differs from the other
    runs of that row and size (`ddl_dv1 beta_init=0.5`). A cell averages only over seeds: runs of
    older code defaults (a setting they did not log, e.g. model.init before reference parity) are
    rows of their own."""
    rows = runs["params.model.row"].astype(str)
    settings = [c for c in runs.columns if c.startswith("params.") and c not in NOT_SETTINGS]
    for _, group in runs.groupby(["params.model.size", "params.model.row"], sort=False):
        varying = [c for c in settings if group[c].nunique(dropna=False) > 1]
        for index, run in group[varying].iterrows():
            rows[index] += "".join(f" {c.removeprefix('params.')}={NOT_LOGGED if pd.isna(value) else value}"
                                   for c, value in run.items())
    return rows


def _cell(runs: pd.DataFrame, metric: str, scale: float) -> Cell:
    """Finished runs give the value (mean ± std over seeds); otherwise say why there is none."""
    if runs.empty:
        return Cell(marker=NO_RUN)
    column = f"metrics.{metric}"
    finished = runs[runs["status"] == "FINISHED"]
    values = finished[column].dropna() * scale if column in finished else pd.Series(dtype=float)
    if len(values):
        return Cell(values.mean(), values.std() if len(values) > 1 else None, len(values))
    if (runs["status"] == "FAILED").any():
        return Cell(marker=FAILED)
    if runs["status"].isin(["RUNNING", "SCHEDULED"]).any():
        return Cell(marker=RUNNING)
    return Cell(marker=NO_RUN)


def _rows(runs: pd.DataFrame) -> list[str]:
    """The paper's rows in its order (each replaced by its variants where runs differ in settings),
    then any other rows."""
    present = sorted(set(runs["row"]))
    ordered = []
    for paper_row in PAPER_ROWS:
        variants = [r for r in present if r.partition(" ")[0] == paper_row]
        ordered += variants if variants and variants != [paper_row] else [paper_row]
    return ordered + [r for r in dict.fromkeys(runs["row"]) if r not in ordered]


def loss_table(runs: pd.DataFrame, sizes: list[str], unit: str) -> Table:
    """Table 3: final validation loss and perplexity per size."""
    paper = paper_values().query("table == 'table3'")
    columns = [Column(f"{size}/{m}", f"{size.capitalize()} {h}", False)
               for size in sizes for m, h in (("val_loss", "Valid Loss"), ("val_ppl", "Valid PPL"))]
    table = Table("table3", "Table 3: final validation loss and perplexity", _rows(runs), columns,
                  note=f"Loss in {unit}. Paper values: FineWeb-Edu, GPT-2 tokens.")
    for row in table.rows:
        for size in sizes:
            subset = runs[(runs["params.model.size"] == size) & (runs["row"] == row)]
            for metric, source in (("val_loss", "val/loss"), ("val_ppl", "val/ppl")):
                cell = _cell(subset, f"final/{source}", 1.0)
                match = paper.query("size == @size and model == @row and metric == @metric")["value"]
                cell.paper = float(match.iloc[0]) if len(match) else None
                table.cells[row, f"{size}/{metric}"] = cell
    table.rank()
    return table


def accuracy_table(runs: pd.DataFrame, size: str, shots: int, tasks: list[str]) -> Table:
    """Tables 1/2 (1-shot) and 5/6 (0-shot): the reported metric per task, in percent, plus Avg."""
    name = ACCURACY_TABLES.get((size, shots), f"accuracy_{size}_{shots}shot")
    paper = paper_values().query("table == @name") if (size, shots) in ACCURACY_TABLES else paper_values().iloc[:0]
    with_average = len(tasks) > 1
    keys = tasks + (["average"] if with_average else [])
    columns = [Column(t, TASK_HEADERS.get(t, t), True) for t in keys]
    label = name.replace("table", "Table ") if (size, shots) in ACCURACY_TABLES else "Accuracy"
    title = f"{label}: {size} models, {shots}-shot accuracy (%) with lm-evaluation-harness"
    table = Table(name, title, _rows(runs), columns, note="Metric per task: see ddl/eval/suites.py.")
    for row in table.rows:
        subset = runs[(runs["params.model.size"] == size) & (runs["row"] == row)]
        for task in tasks:
            cell = _cell(subset, f"eval/{shots}shot/{task}/reported", 100.0)
            match = paper.query("model == @row and task == @task")["value"]
            cell.paper = float(match.iloc[0]) if len(match) else None
            table.cells[row, task] = cell
        if with_average:
            parts = [table.cells[row, t] for t in tasks]
            means = [c.mean for c in parts]
            average = Cell(sum(means) / len(means), None, min(c.n for c in parts)) if None not in means else \
                Cell(marker=next((c.marker for c in parts if c.marker and c.marker != NO_RUN), NO_RUN))
            match = paper.query("model == @row and task == 'average'")["value"]
            average.paper = float(match.iloc[0]) if len(match) and set(tasks) == set(PAPER_TASKS) else None
            table.cells[row, "average"] = average
    table.rank()
    return table


def evaluated(runs: pd.DataFrame) -> list[tuple[int, list[str]]]:
    """(shots, tasks) found in the runs' metrics, the paper's tasks first."""
    found: dict[int, set[str]] = {}
    for column in runs.columns:
        parts = column.split("/")
        if column.startswith("metrics.eval/") and len(parts) == 4 and parts[3] == "reported":
            found.setdefault(int(parts[1].removesuffix("shot")), set()).add(parts[2])
    order = list(PAPER_TASKS)
    return [(k, sorted(v, key=lambda t: (order.index(t) if t in order else len(order), t)))
            for k, v in sorted(found.items())]


def fmt_number(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 10 else f"{value:.2f}"

