"""The paper's tables rebuilt from runs: cells with mean ± std over seeds, each row paired by seed
with the baseline of the same size, data and schedule (difference, 95% interval, verdict), the
paper's own relative difference beside ours, and explicit markers where a run is missing or failed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from ..eval.suites import PAPER_TASKS
from ..stats import BETTER, CONFIDENCE, Difference, paired
from .compute import STEPS

PAPER_ROWS = {"baseline": "Baseline", "ddl_dv1": "DDL (d_v=1)", "ddl_dv4": "DDL (d_v=4)",
              "ddl_dv4_cc": "DDL-CC", "ddl_dv4_ec": "DDL-EC", "ddl_dv4_cc_ec": "DDL-CC-EC"}
BASELINE = "baseline"
TASK_HEADERS = {"arc_challenge": "ARC-C", "arc_easy": "ARC-E", "hellaswag": "Hellaswag", "openbookqa": "OpenBookQA",
                "piqa": "PIQA", "sciq": "SciQ", "social_iqa": "Social IQA", "winogrande": "WG", "average": "Avg."}
ACCURACY_TABLES = {("small", 1): "table1", ("medium", 1): "table2", ("small", 0): "table5", ("medium", 0): "table6"}
PAPER_SIZES = ("small", "medium")
PAPER_DATA = {"params.data.source": "fineweb_edu", "params.data.tokenizer": "gpt2"}   # the paper's losses' tokens
NO_RUN, FAILED, RUNNING = "—", "FAILED", "running"
# Provenance marks: a cell built from such a run says so in a footnote.
MARKS = {"tags.ddl.history_from": ("†", "trained under another experiment's run and reused here (its curves copied)"),
         "tags.ddl.imported_from": ("‡", "imported from a checkpoint of the authors' code (ddl-eval import-reference)")}
# What a DDL arm and its baseline share (besides data and schedule): everything but the residual rule.
BACKBONE = tuple(f"params.model.{k}" for k in ("size", "vocab_size", "n_layer", "n_head", "d_model", "max_seq_len",
                                                 "rope_base", "init", "init_std", "init_streams", "norm_eps",
                                                 "qk_norm"))


@dataclass
class Cell:
    mean: float | None = None
    std: float | None = None
    n: int = 0                       # seeds
    marker: str | None = None       # NO_RUN / FAILED / RUNNING when there is no finished value
    paper: float | None = None      # the paper's value, where ours is measured the same way
    rank: int = 0                    # 1 resolved best, 2 resolved second best in its column
    seeds: dict[str, float] = field(default_factory=dict)     # seed -> value: what pairing reads
    versus: Difference | None = None                          # minus the baseline's, paired by seed
    paper_relative: dict[str, float] = field(default_factory=dict)   # paper size -> its % to its baseline
    compute: object | None = None   # a loss at equal compute against the baseline's (ddl.report.compute.AtCompute)
    stderr: float | None = None     # evaluation: the per-run item-level stderr (mean over seeds)
    items: int | None = None        # evaluation: items scored per run
    marks: str = ""                  # provenance footnote marks

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
    compared: list[tuple[str, str]] = field(default_factory=list)   # (column key, heading) paired with the baseline
    evaluation: bool = False         # accuracy cells: item counts and stderrs
    interval: str = f"{CONFIDENCE:.0%} CI"   # what the compared columns' intervals are
    measure: str = "flops"           # the compute its verdicts at equal compute are read in (ddl.costs)
    unit: str = "seed"               # what its comparisons pair: seed, or replicate (a tuned table)
    sections: list = field(default_factory=list)   # (heading, headers, rows) shown under it, after its comparisons

    def rank(self) -> None:
        """Rank 1: better than every other cell of its column, resolved by the paired interval;
        rank 2: the same among the rest. Unresolved orders (one seed, overlapping) rank nothing."""
        for col in self.columns:
            rest = [c for row in self.rows if (c := self.cells[row, col.key]).mean is not None]
            for place in (1, 2):
                best = [c for c in rest if len(rest) > 1 and all(
                    _beats(c, other, col.higher_is_better) for other in rest if other is not c)]
                if not best:
                    break
                best[0].rank = place
                rest = [c for c in rest if c is not best[0]]

    def marks(self) -> dict[str, str]:
        """The footnotes the cells use: mark -> what it means."""
        used = "".join(c.marks for c in self.cells.values())
        return {mark: text for mark, text in MARKS.values() if mark in used}


def _beats(cell: Cell, other: Cell, higher_is_better: bool) -> bool:
    difference = paired(cell.seeds, other.seeds)
    return difference is not None and difference.verdict(higher_is_better) == BETTER


def paper_values() -> pd.DataFrame:
    from ..paper import table_file
    return pd.read_csv(table_file().open())


def family_and_n_h(row: str) -> tuple[str, int]:
    """'ddl_dv4_nh2 beta_init=0.5' -> ('ddl_dv4', 2): the row without its DeltaProduct steps, and them."""
    family, _, n_h = row.partition(" ")[0].partition("_nh")
    return family, int(n_h or 1)


def row_label(row: str) -> str:
    """'ddl_dv1 beta_init=0.5' -> 'DDL (d_v=1) beta_init=0.5'; 'ddl_dv4_nh2' -> 'DDL (d_v=4) n_h=2'."""
    family, n_h = family_and_n_h(row)
    settings = row.partition(" ")[2]
    return " ".join(filter(None, (PAPER_ROWS.get(family, family), n_h > 1 and f"n_h={n_h}", settings)))


SEARCHED = "tags.ddl.trial_values"


def json_object(text) -> dict:
    """A tag's JSON object; {} for no tag, or for one damaged in the store (the search left that run out too)."""
    try:
        found = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def trial_values(runs: pd.DataFrame) -> pd.Series:
    """Each run's searched values ({} for a run of no search, or whose tag is damaged)."""
    if SEARCHED not in runs:
        return pd.Series([{}] * len(runs), index=runs.index)
    return runs[SEARCHED].map(json_object)


NOT_SETTINGS = {"params.seed", "params.model.size", "params.model.row"}
NOT_LOGGED = "(not logged)"   # a setting the run's code did not have yet: it ran that code's default
APPLIES_UNDER = {"params.model.mup_base_width": ("params.model.param", "mup")}   # left out of other runs' rows


def variant_rows(runs: pd.DataFrame) -> pd.Series:
    """Each run's table row: its paper row, plus the settings in which it differs from the other
    runs of that row and size (`ddl_dv1 beta_init=0.5`). A cell averages only over seeds: runs of
    older code defaults (a setting they did not log, e.g. model.init before reference parity) are
    rows of their own."""
    rows = runs["params.model.row"].astype(str)
    settings = [c for c in runs.columns if c.startswith("params.") and c not in NOT_SETTINGS]
    for _, group in runs.groupby(["params.model.size", "params.model.row"], sort=False):
        varying = [c for c in settings if group[c].nunique(dropna=False) > 1]
        for index, run in group.iterrows():
            rows[index] += "".join(f" {c.removeprefix('params.')}={NOT_LOGGED if pd.isna(run[c]) else run[c]}"
                                   for c in varying if c not in APPLIES_UNDER or run.get(APPLIES_UNDER[c][0]) ==
                                   APPLIES_UNDER[c][1])
    return rows


def _finished(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The finished runs that logged `metric`, one per seed (the newest: MLflow lists newest first)."""
    column = f"metrics.{metric}"
    if column not in runs:
        return runs.iloc[:0]
    finished = runs[(runs["status"] == "FINISHED") & runs[column].notna()]
    return finished.drop_duplicates("params.seed")


def _cell(runs: pd.DataFrame, metric: str, scale: float) -> Cell:
    """Finished runs give the value (mean ± std over seeds); otherwise say why there is none."""
    if runs.empty:
        return Cell(marker=NO_RUN)
    finished = _finished(runs, metric)
    if len(finished):
        seeds = {str(seed): float(value) * scale
                 for seed, value in zip(finished["params.seed"], finished[f"metrics.{metric}"], strict=True)}
        values = pd.Series(seeds)
        marks = "".join(mark for tag, (mark, _) in MARKS.items() if tag in finished and finished[tag].notna().any())
        return Cell(values.mean(), values.std() if len(values) > 1 else None, len(values), seeds=seeds, marks=marks)
    if (runs["status"] == "FAILED").any():
        return Cell(marker=FAILED)
    if runs["status"].isin(["RUNNING", "SCHEDULED"]).any():
        return Cell(marker=RUNNING)
    return Cell(marker=NO_RUN)


def _eval_cell(runs: pd.DataFrame, shots: int, task: str) -> Cell:
    """An accuracy cell (%), with its runs' item count and item-level stderr where they logged them."""
    prefix = f"eval/{shots}shot/{task}"
    cell = _cell(runs, f"{prefix}/reported", 100.0)
    finished = _finished(runs, f"{prefix}/reported")
    logged = [f"metrics.{prefix}/{m}" for m in ("stderr", "n")]
    if len(finished) and all(c in finished and finished[c].notna().all() for c in logged):
        cell.stderr = 100.0 * float(finished[logged[0]].mean())
        cell.items = int(finished[logged[1]].max())
    return cell


def _average(parts: list[Cell]) -> Cell:
    """The mean over tasks, seed by seed (seeds every task has); items add up, stderrs combine."""
    if any(c.mean is None for c in parts):
        return Cell(marker=next((c.marker for c in parts if c.marker and c.marker != NO_RUN), NO_RUN))
    seeds = set.intersection(*(set(c.seeds) for c in parts))
    per_seed = pd.Series({s: sum(c.seeds[s] for c in parts) / len(parts) for s in sorted(seeds)}, dtype=float)
    if per_seed.empty:
        return Cell(marker=NO_RUN)
    cell = Cell(per_seed.mean(), per_seed.std() if len(per_seed) > 1 else None, len(per_seed),
                seeds=per_seed.to_dict(), marks="".join(sorted(set("".join(c.marks for c in parts)))))
    if all(c.stderr is not None and c.items is not None for c in parts):
        cell.stderr = sum(c.stderr ** 2 for c in parts) ** 0.5 / len(parts)
        cell.items = sum(c.items for c in parts)
    return cell


def _rows(runs: pd.DataFrame) -> list[str]:
    """The paper's rows in its order (each replaced by its variants where runs differ in settings or
    n_h, n_h ascending), then any other rows."""
    present = sorted(set(runs["row"]))
    ordered = []
    for paper_row in PAPER_ROWS:
        variants = sorted((r for r in present if family_and_n_h(r)[0] == paper_row),
                          key=lambda r: (family_and_n_h(r), r))
        ordered += variants if variants and variants != [paper_row] else [paper_row]
    return ordered + [r for r in dict.fromkeys(runs["row"]) if r not in ordered]


def _paper_relative(paper: pd.DataFrame, row: str) -> dict[str, float]:
    """The paper's difference of `row` to its baseline in % of the baseline, per size it reports
    (`paper`: that table's rows for one metric or task, columns size, model, value)."""
    model, relative = row.partition(" ")[0], {}
    for size in PAPER_SIZES:
        values = paper[paper["size"] == size].set_index("model")["value"]
        if model != BASELINE and model in values and BASELINE in values:
            relative[size] = 100.0 * (values[model] - values[BASELINE]) / values[BASELINE]
    return relative


def baseline_rows(runs: pd.DataFrame) -> dict[str, str]:
    """Each non-baseline row's baseline row among `runs` (one size): the baseline trained on the
    same data, with the same schedule and backbone. Rows with no such baseline, or several, have none;
    but a row of a search with none there (each row at its own best, as a carried row is) pairs with the
    one baseline that differs from it only in the searched keys. Runs of no search pair as ever."""
    shared = [c for c in runs.columns if c.startswith(("params.data.", "params.train.")) or c in BACKBONE]
    searched = {f"params.{key}" for values in trial_values(runs) for key in values}
    return {**_pairs(runs, [c for c in shared if c not in searched]), **_pairs(runs, shared)}


def _pairs(runs: pd.DataFrame, shared: list[str]) -> dict[str, str]:
    """Each non-baseline row's one baseline row of the same values in the columns `shared`."""
    def setting(group: pd.DataFrame) -> tuple:
        return tuple(None if pd.isna(v) else str(v) for v in group[shared].iloc[0])

    groups = dict(list(runs.groupby("row", sort=False)))
    baselines = {row: setting(g) for row, g in groups.items() if row.partition(" ")[0] == BASELINE}
    matches = {row: [b for b, s in baselines.items() if s == setting(g)] for row, g in groups.items()
               if row not in baselines}
    return {row: found[0] for row, found in matches.items() if len(found) == 1}


def _compare(table: Table, runs: pd.DataFrame, keys: list[str], histories: pd.DataFrame | None = None) -> None:
    """Pair each row's cells in `keys` with its baseline's, seed by seed; a loss (with `histories`) at equal compute
    too (ddl.report.compute)."""
    from .compute import at_equal_compute
    for row, base in baseline_rows(runs).items():
        for key in keys:
            cell = table.cells[row, key]
            cell.versus = paired(cell.seeds, table.cells[base, key].seeds)
            if histories is not None and key.endswith("/val_loss"):
                cell.compute = at_equal_compute(runs[runs["row"] == row], runs[runs["row"] == base], histories,
                                                table.measure, longer=longer_runs(runs, base))


WARMUP = "params.train.warmup_steps"


def longer_runs(runs: pd.DataFrame, base: str) -> pd.DataFrame:
    """Runs of the baseline row `base` but for their steps (its other rows, e.g. `baseline train.steps=628`): where it
    was trained for a costlier row's compute. Their warmup is the same steps, or the same share of the run
    (`train.warmup_frac`, `train.tokens_per_param`: each run's own rounding)."""
    shared = [c for c in runs.columns if (c.startswith(("params.data.", "params.train.")) or c in BACKBONE)
              and c not in (STEPS, WARMUP)]
    own = runs[runs["row"] == base]
    if own.empty:
        return own
    setting = tuple(None if pd.isna(v) else str(v) for v in own[shared].iloc[0])
    baselines = runs[(runs["row"].str.partition(" ")[0] == BASELINE) & (runs["row"] != base)]
    if not len(baselines):
        return baselines
    same = baselines[shared].apply(lambda r: tuple(None if pd.isna(v) else str(v) for v in r) == setting, axis=1)
    if WARMUP in runs:
        steps, warmup = (pd.to_numeric(own[c].iloc[0]) for c in (STEPS, WARMUP))
        their_steps, their_warmup = (pd.to_numeric(baselines[c]) for c in (STEPS, WARMUP))
        same &= (their_warmup == warmup) | ((their_warmup - warmup / steps * their_steps).abs() <= 1)
    return baselines[same]


def _on_paper_data(runs: pd.DataFrame) -> bool:
    return not runs.empty and all(column in runs and (runs[column] == value).all()
                                  for column, value in PAPER_DATA.items())


def loss_table(runs: pd.DataFrame, sizes: list[str], unit: str, histories: pd.DataFrame | None = None,
               measure: str = "flops") -> Table:
    """Table 3: final validation loss and perplexity per size; each row's loss paired with its baseline's, at equal
    tokens and (with the runs' `histories`) at equal compute in `measure`."""
    paper = paper_values().query("table == 'table3'")
    columns = [Column(f"{size}/{m}", f"{size.capitalize()} {h}", False)
               for size in sizes for m, h in (("val_loss", "Valid Loss"), ("val_ppl", "Valid PPL"))]
    table = Table("table3", "Table 3: final validation loss and perplexity", _rows(runs), columns,
                  compared=[(f"{size}/val_loss", f"{size.capitalize()} valid loss") for size in sizes], measure=measure)
    for row in table.rows:
        for size in sizes:
            subset = runs[(runs["params.model.size"] == size) & (runs["row"] == row)]
            for metric, source in (("val_loss", "val/loss"), ("val_ppl", "val/ppl")):
                cell = _cell(subset, f"final/{source}", 1.0)
                in_paper = paper[paper["metric"] == metric]
                cell.paper_relative = _paper_relative(in_paper, row)
                match = in_paper.query("size == @size and model == @row")["value"]
                if len(match) and _on_paper_data(_finished(subset, f"final/{source}")):
                    cell.paper = float(match.iloc[0])
                table.cells[row, f"{size}/{metric}"] = cell
    for size in sizes:
        _compare(table, runs[runs["params.model.size"] == size], [f"{size}/val_loss", f"{size}/val_ppl"], histories)
    table.note = f"Loss in {unit}." + (" Paper values beside runs on its data (FineWeb-Edu, GPT-2 tokens)."
                                       if any(c.paper is not None for c in table.cells.values()) else "")
    if runs.get("params.train.lr", pd.Series(dtype=str)).nunique() > 1:
        table.note += (" Rows differ in train.lr: each is paired with the baseline at the same train.lr, a gap at a "
                       "shared learning rate, not at each row's own best (the sensitivity figure; a search's tuned "
                       "table); a row of a search with none there (a carried row) with its tuned baseline, each at "
                       "its own best.")
    table.rank()
    return table


def deltaproduct_table(runs: pd.DataFrame, sizes: list[str], unit: str) -> Table | None:
    """DeltaProduct (ModelConfig.n_h), in the paper's style: per size the parameter count and the final
    validation loss of the baseline and of every DDL row that has an n_h > 1 sibling, n_h ascending;
    each loss paired with its baseline's. None when no run has n_h > 1."""
    if "params.model.n_h" not in runs:          # n_h = 1 is not logged (LATER_FIELDS)
        return None
    n_h = pd.to_numeric(runs["params.model.n_h"], errors="coerce")
    families = {family_and_n_h(row)[0] for row in runs.loc[n_h > 1, "row"]}
    if not families:
        return None
    rows = [r for r in _rows(runs) if r.partition(" ")[0] == BASELINE or family_and_n_h(r)[0] in families]
    columns = [Column(f"{size}/{m}", f"{size.capitalize()} {h}", False)
               for size in sizes for m, h in (("params", "Params (M)"), ("val_loss", "Valid Loss"))]
    table = Table("deltaproduct", "DeltaProduct: n_h Delta updates per sublayer, final validation loss", rows,
                  columns, compared=[(f"{size}/val_loss", f"{size.capitalize()} valid loss") for size in sizes])
    for row in rows:
        for size in sizes:
            subset = runs[(runs["params.model.size"] == size) & (runs["row"] == row)]
            table.cells[row, f"{size}/val_loss"] = _cell(subset, "final/val/loss", 1.0)
            counts = pd.to_numeric(subset.get("params.model.params", pd.Series(dtype=float)), errors="coerce")
            table.cells[row, f"{size}/params"] = Cell(counts.iloc[0] / 1e6) if counts.notna().any() \
                else Cell(marker=NO_RUN)
    for size in sizes:
        _compare(table, runs[runs["params.model.size"] == size], [f"{size}/val_loss"])
    table.note = (f"Loss in {unit}. n_h: Delta updates per sublayer, each with its own key map, gate and value "
                  "(ModelConfig.n_h); n_h=1 is the paper's DDL. The paper has no such rows.")
    table.rank()
    return table


def accuracy_table(runs: pd.DataFrame, size: str, shots: int, tasks: list[str]) -> Table:
    """Tables 1/2 (1-shot) and 5/6 (0-shot): the reported metric per task, in percent, plus Avg."""
    name = ACCURACY_TABLES.get((size, shots), f"accuracy_{size}_{shots}shot")
    paper_tables = [ACCURACY_TABLES[s, shots] for s in PAPER_SIZES if (s, shots) in ACCURACY_TABLES]  # noqa: F841
    paper = paper_values().query("table in @paper_tables")
    with_average = len(tasks) > 1
    keys = tasks + (["average"] if with_average else [])
    columns = [Column(t, TASK_HEADERS.get(t, t), True) for t in keys]
    label = name.replace("table", "Table ") if (size, shots) in ACCURACY_TABLES else "Accuracy"
    title = f"{label}: {size} models, {shots}-shot accuracy (%) with lm-evaluation-harness"
    table = Table(name, title, _rows(runs), columns, compared=[(keys[-1], f"{TASK_HEADERS.get(keys[-1], keys[-1])}")],
                  evaluation=True)
    subset_of_size = runs[runs["params.model.size"] == size]
    for row in table.rows:
        subset = subset_of_size[subset_of_size["row"] == row]
        for task in keys:
            if task == "average":
                cell = _average([table.cells[row, t] for t in tasks])
            else:
                cell = _eval_cell(subset, shots, task)
            if task != "average" or set(tasks) == set(PAPER_TASKS):
                in_paper = paper[paper["task"] == task]
                cell.paper_relative = _paper_relative(in_paper, row)
                match = in_paper.query("size == @size and model == @row")["value"]
                cell.paper = float(match.iloc[0]) if len(match) else None
            table.cells[row, task] = cell
    _compare(table, subset_of_size, keys)
    covered = f" Avg.: the mean over {', '.join(TASK_HEADERS.get(t, t) for t in tasks)} ({len(tasks)} tasks)." \
        if with_average else ""
    paper_note = " Paper: its value for this size and task." if any(c.paper is not None for c in table.cells.values()) \
        else ""
    table.note = ("Metric per task: see ddl/eval/suites.py. SE: the item-level standard error of one run's score "
                  f"(lm-eval's, else binomial), over that many items.{covered}{paper_note}")
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

