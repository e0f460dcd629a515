"""One Table, four renderings: Markdown, LaTeX (booktabs), CSV (long form) and HTML.

Each table is its grid (ours, mean ± std over seeds, the paper's value where it is measured the
same way) and, under it, each compared column as rows against the baseline: the paired
difference with its 95% interval, our relative difference beside the paper's, and a verdict.
"""

from __future__ import annotations

import csv
import html
import io

from .scaling import PAPER_N, CrossSize, sections
from ..costs import COMPUTE_MEASURES
from ..stats import CONFIDENCE, detectable, seeds_to_resolve
from .tables import BASELINE, PAPER_SIZES, Cell, Table, fmt_number, row_label

LEGEND = (f"Mean ± std over seeds. Bold: best, underlined: second best, only where the paired "
          f"{CONFIDENCE:.0%} interval over seeds resolves the order (never with one seed). "
          "— no run, FAILED / running: no finished run. Against the baseline, no interval: one seed, or the "
          "same difference for every seed (no spread to judge by).")


def ours(cell: Cell, evaluation: bool = False) -> str:
    if cell.mean is None:
        return cell.marker or ""
    number = (lambda x: f"{x:.2f}") if evaluation else fmt_number   # accuracy in %: two decimals
    text = number(cell.mean) + (f" ± {number(cell.std)}" if cell.std is not None else "") + cell.marks
    if evaluation:
        text += f" (SE {cell.stderr:.2f}, {cell.items} items)" if cell.stderr is not None else " (SE not logged)"
    return text


def _paper(cell: Cell) -> str:
    if cell.paper is None:
        return ""
    return f"paper {fmt_number(cell.paper)}, Δ {cell.delta:+.2f}" if cell.delta is not None \
        else f"paper {fmt_number(cell.paper)}"


def _signed(value: float, evaluation: bool) -> str:
    return f"{value:+.2f}" if evaluation else f"{value:+.4f}"


def comparison(table: Table, key: str) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of one compared column against the baseline; the paper's columns only where
    the paper has a value for some row."""
    sizes = [s for s in PAPER_SIZES if any(s in table.cells[r, key].paper_relative for r in table.rows)]
    at_compute = any(table.cells[r, key].compute is not None for r in table.rows)
    headers = ["Model", f"{table.unit}s", f"Δ at equal tokens [{table.interval}]", "Δ %", "verdict"] + \
        ([f"Δ % at equal compute ({COMPUTE_MEASURES[table.measure]}) [{table.interval}]", "verdict at equal compute",
          "how"] if at_compute else []) + [f"paper Δ % ({s})" for s in sizes] + \
        ["seeds needed: ours" + (f" / paper's ({sizes[0]})" if sizes else ""), "r at a seed"] * (table.unit == "seed")
    higher_is_better = next(c.higher_is_better for c in table.columns if c.key == key)
    lines = []
    for row in table.rows:
        cell = table.cells[row, key]
        if row.partition(" ")[0] == BASELINE or cell.mean is None:
            continue
        paper = [f"{cell.paper_relative[s]:+.2f}%" if s in cell.paper_relative else "" for s in sizes]
        d = cell.versus
        compute = at_compute_cells(cell.compute) if at_compute else []
        if d is None:
            lines.append([row_label(row), str(cell.n), f"no baseline run with a shared {table.unit}", "", ""] + compute
                         + paper + ["", ""] * (table.unit == "seed"))
            continue
        interval = "" if d.low is None else \
            f" [{_signed(d.low, table.evaluation)}, {_signed(d.high, table.evaluation)}]"
        relative = "" if d.relative is None else f"{d.relative:+.2f}%"
        needed = ""
        if d.std:
            effects = [d.mean] + ([cell.paper_relative[sizes[0]] * abs(d.reference) / 100]
                                  if sizes and sizes[0] in cell.paper_relative else [])
            needed = " / ".join(str(seeds_to_resolve(d.std, e) or "> 1000") for e in effects)
        paper_gap = f"the paper's gap at {sizes[0]} is {paper[0]}" if paper and paper[0] else ""
        lines.append([row_label(row), str(d.n), _signed(d.mean, table.evaluation) + interval, relative,
                      d.verdict(higher_is_better) + resolvable(d, 1 - CONFIDENCE, table.unit, paper_gap)]
                     + compute + paper + [needed, _r(d.correlation)] * (table.unit == "seed"))
    return headers, lines


def resolvable(d, alpha: float, unit: str, paper: str = "") -> str:
    """Beside a verdict: the smallest gap, in % of the reference, its units (seeds, replicates) resolve with 80%
    power at their spread and level (ddl.stats.detectable), what "not resolved" rules out; and the paper's gap."""
    if d is None or d.reference == 0:
        return ""
    if d.n < 2 or not d.std:
        said = f"one {unit}: resolves no gap" if d.n < 2 else "no spread to size it from"
    else:
        said = f"could resolve >= {100 * detectable(d.std, d.n, alpha) / abs(d.reference):.2g}%"
    return f" ({said}{'; ' + paper if paper else ''})"


def _r(correlation: float | None) -> str:
    """The rows' correlation across seeds: the share of a seed's noise pairing removes (docs/results.md)."""
    return "" if correlation is None else f"{correlation:+.2f}"


def relative_text(d) -> str:
    """A paired difference in % of the reference's mean, with its interval: `-6.6% [-12.9, -0.3]`."""
    if d is None or d.relative is None:
        return ""
    scale = 100 / abs(d.reference)
    interval = "" if d.low is None else f" [{scale * d.low:+.1f}, {scale * d.high:+.1f}]"
    return f"{d.relative:+.1f}%{interval}"


def at_compute_cells(found) -> list[str]:
    """The three cells of a loss at equal compute: its gap, its verdict and how it was read (the cost ratio)."""
    if found is None:
        return ["", "", ""]
    d = found.difference
    verdict = "" if d is None else d.verdict(False)
    cost = found.how if found.ratio is None else f"cost ratio {found.ratio:.3f}; {found.how}"
    return [relative_text(d) or "no paired value", verdict, cost]


def compared(table: Table):
    """(heading, headers, rows) of each compared column that has a row to show."""
    for key, heading in table.compared:
        headers, lines = comparison(table, key)
        if lines:
            yield f"{heading} against the baseline, paired by {table.unit}", headers, lines
    yield from table.sections


def _footnotes(table: Table) -> list[str]:
    return [f"{mark} {text}" for mark, text in table.marks().items()]


def markdown(table: Table) -> str:
    def cell_text(c: Cell) -> str:
        text = ours(c, table.evaluation)
        text = f"**{text}**" if c.rank == 1 else f"<u>{text}</u>" if c.rank == 2 else text
        return f"{text} ({_paper(c)})" if c.paper is not None else text
    lines = [f"### {table.title}", "", "| Model | " + " | ".join(c.header for c in table.columns) + " |",
             "|---|" + "---|" * len(table.columns)]
    lines += [f"| {row_label(row)} | " + " | ".join(cell_text(table.cells[row, c.key]) for c in table.columns) + " |"
              for row in table.rows]
    lines += ["", f"{LEGEND} {table.note}", *[f"{n}  " for n in _footnotes(table)], ""]
    for heading, headers, rows in compared(table):
        lines += [f"#### {heading}", "", *_plain_markdown(headers, rows), ""]
    return "\n".join(lines)


def _plain_markdown(headers: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|",
            *["| " + " | ".join(r) + " |" for r in rows]]


def _plain_html(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def latex(table: Table) -> str:
    def esc(text: str) -> str:
        return (text.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$").replace("—", "--")
                .replace("Δ", r"$\Delta$").replace("†", r"$^\dagger$").replace("‡", r"$^\ddagger$"))

    def cell_text(c: Cell) -> str:
        text = esc(ours(c, table.evaluation))
        text = rf"\textbf{{{text}}}" if c.rank == 1 else rf"\underline{{{text}}}" if c.rank == 2 else text
        if c.paper is not None:
            delta = f", {c.delta:+.2f}" if c.delta is not None else ""
            text += rf" {{\scriptsize({fmt_number(c.paper)}" + delta + ")}"
        return text

    def tabular(headers: list[str], rows: list[list[str]]) -> list[str]:
        return [r"\begin{tabular}{l" + "c" * (len(headers) - 1) + "}", r"\toprule",
                " & ".join(esc(h) for h in headers) + r" \\", r"\midrule",
                *[" & ".join(esc(x) for x in r).replace("d\\_v", "$d_v$") + r" \\" for r in rows],
                r"\bottomrule", r"\end{tabular}"]

    grid = [[row_label(row)] + [cell_text(table.cells[row, c.key]) for c in table.columns] for row in table.rows]
    caption = " ".join([table.title + ".", LEGEND, table.note, *_footnotes(table)])
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{esc(caption)}}}",
             r"\begin{tabular}{l" + "c" * len(table.columns) + "}", r"\toprule",
             "Model & " + " & ".join(esc(c.header) for c in table.columns) + r" \\", r"\midrule"]
    lines += [esc(r[0]).replace("d\\_v", "$d_v$") + " & " + " & ".join(r[1:]) + r" \\" for r in grid]
    lines += [r"\bottomrule", r"\end{tabular}"]
    for heading, headers, rows in compared(table):
        lines += [r"\par\medskip", rf"{{\small {esc(heading)}}}\par", *tabular(headers, rows)]
    lines += [r"\end{table}", ""]
    return "\n".join(lines)


def csv_text(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["table", "row", "column", "mean", "std", "n_seeds", "marker", "marks", "stderr", "items",
                     "paper", "delta", "rank", "vs_baseline", "ci_low", "ci_high", "paired_seeds", "relative_pct",
                     "verdict", *[f"paper_relative_pct_{s}" for s in PAPER_SIZES]])
    for row in table.rows:
        for col in table.columns:
            c, d = table.cells[row, col.key], table.cells[row, col.key].versus
            paired = [d.mean, d.low, d.high, d.n, d.relative, d.verdict(col.higher_is_better)] if d else [None] * 6
            writer.writerow([table.name, row, col.key, c.mean, c.std, c.n, c.marker or "", c.marks, c.stderr, c.items,
                             c.paper, c.delta, c.rank or "", *paired, *[c.paper_relative.get(s) for s in PAPER_SIZES]])
    return out.getvalue()


def html_table(table: Table) -> str:
    def cell_html(c: Cell) -> str:
        text = html.escape(ours(c, table.evaluation))
        text = f"<b>{text}</b>" if c.rank == 1 else f"<u>{text}</u>" if c.rank == 2 else text
        cls = ' class="missing"' if c.mean is None else ""
        paper = f'<br><small>{html.escape(_paper(c))}</small>' if c.paper is not None else ""
        return f"<td{cls}>{text}{paper}</td>"

    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in table.columns)
    body = "".join(f"<tr><th>{html.escape(row_label(row))}</th>"
                   + "".join(cell_html(table.cells[row, c.key]) for c in table.columns) + "</tr>" for row in table.rows)
    notes = "".join(f"<p class=note>{html.escape(n)}</p>" for n in [f"{LEGEND} {table.note}", *_footnotes(table)])
    against = "".join(f"<h3>{html.escape(heading)}</h3>{_plain_html(headers, rows)}"
                      for heading, headers, rows in compared(table))
    return f"<h2>{html.escape(table.title)}</h2><table><tr><th>Model</th>{head}</tr>{body}</table>{notes}{against}"


def html_page(experiment: str, tables: list[Table], figures: list[str], summary: str, across: str = "") -> str:
    """The report's index.html; `across`: the cross-size section (scaling_html), where there is one."""
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
             "padding:4px 8px;text-align:center}td.missing{color:#a00}small{color:#666}.note{color:#555}")
    images = "".join(f'<figure><img src="{f}" width="900"><figcaption>{f}</figcaption></figure>' for f in figures)
    return (f"<!doctype html><html><head><meta charset=utf-8><title>ddl report: {html.escape(experiment)}</title>"
            f"<style>{style}</style></head><body><h1>ddl report: {html.escape(experiment)}</h1>"
            f"<p>{html.escape(summary)}</p>" + "".join(html_table(t) for t in tables) + across +
            f"<h2>Figure 2: loss curves</h2>{images}</body></html>")


def scaling_markdown(view: CrossSize) -> str:
    lines = []
    for title, headers, rows, note in sections(view):
        lines += [f"### {title}", "", *_plain_markdown(headers, rows), "", note, ""]
    return "\n".join(lines)


def scaling_html(view: CrossSize, figures: list[str]) -> str:
    """The cross-size tables, then their figures (PNG, linked to the SVG), then the files they are in."""
    parts = [f"<h3>{html.escape(title)}</h3>{_plain_html(headers, rows)}<p class=note>{html.escape(note)}</p>"
             for title, headers, rows, note in sections(view)]
    images = "".join(f'<figure><a href="{f[:-4]}.svg"><img src="{f}" width="900"></a><figcaption>{f}</figcaption>'
                     "</figure>" for f in figures if f.endswith(".png"))
    files = '<p><a href="scaling.md">scaling.md</a> · <a href="scaling.csv">scaling.csv</a></p>'
    return "<h2>Across sizes: does the gain grow or vanish?</h2>" + "".join(parts) + images + files


SCALING_CSV = ["kind", "row", "size", "n", "relative_pct", "ci_low_pct", "ci_high_pct", "seeds", "points", "verdict",
               "params_ratio", "flops_per_token", "tokens", "form", "a", "alpha", "alpha_low", "alpha_high", "c",
               "extrapolated"]


def scaling_csv(view: CrossSize) -> str:
    """Long form: one line per point (ours, `paper`), per row's fit and per extrapolated gap."""
    out = io.StringIO()
    writer = csv.DictWriter(out, SCALING_CSV)
    writer.writeheader()
    for p in view.points:
        low, high = p.interval or (None, None)
        d = p.difference
        writer.writerow(dict(kind="point" if d else "paper", row=p.row, size=p.size, n=p.n, relative_pct=p.relative,
                             ci_low_pct=low, ci_high_pct=high, seeds=d and d.n, verdict=d and d.verdict(False),
                             params_ratio=p.params_ratio, flops_per_token=p.flops_per_token, tokens=p.tokens))
    for f in view.fits:
        low, high = f.alpha_interval or (None, None)
        writer.writerow(dict(kind="fit", row=f.row, points=f.points, form=f.form, a=f.a, alpha=f.alpha,
                             alpha_low=low, alpha_high=high, c=f.c))
    for g in view.gaps:
        low, high = g.interval or (None, None)
        writer.writerow(dict(kind="extrapolated_gap", row=g.row, size=g.size, n=PAPER_N[g.size],
                             relative_pct=g.relative, ci_low_pct=low, ci_high_pct=high, points=g.points,
                             extrapolated=g.extrapolated))
    return out.getvalue()
