"""One Table, four renderings: Markdown, LaTeX (booktabs), CSV (long form) and HTML."""

from __future__ import annotations

import csv
import html
import io

from .tables import Cell, Table, fmt_number, row_label


def ours_text(cell: Cell) -> str:
    if cell.mean is None:
        return cell.marker or ""
    text = fmt_number(cell.mean)
    return text + (f" ± {fmt_number(cell.std)}" if cell.std is not None else "")


def _paper(cell: Cell) -> str:
    return "" if cell.paper is None else f"paper {fmt_number(cell.paper)}, Δ {cell.delta:+.2f}" if cell.delta is not None \
        else f"paper {fmt_number(cell.paper)}"


def markdown(table: Table) -> str:
    def cell_text(c: Cell) -> str:
        ours = ours_text(c)
        ours = f"**{ours}**" if c.rank == 1 else f"<u>{ours}</u>" if c.rank == 2 else ours
        return f"{ours} ({_paper(c)})" if c.paper is not None else ours
    lines = [f"### {table.title}", "", "| Model | " + " | ".join(c.header for c in table.columns) + " |",
             "|---|" + "---|" * len(table.columns)]
    lines += [f"| {row_label(row)} | " + " | ".join(cell_text(table.cells[row, c.key]) for c in table.columns) + " |"
              for row in table.rows]
    lines += ["", f"Bold: best, underlined: second best. — no run, FAILED / running: no finished run. {table.note}", ""]
    return "\n".join(lines)


def latex(table: Table) -> str:
    def esc(text: str) -> str:
        return text.replace("_", r"\_").replace("%", r"\%")

    def cell_text(c: Cell) -> str:
        ours = esc(ours_text(c)).replace("±", r"$\pm$").replace("—", "--")
        ours = rf"\textbf{{{ours}}}" if c.rank == 1 else rf"\underline{{{ours}}}" if c.rank == 2 else ours
        if c.paper is not None:
            ours += rf" {{\scriptsize({fmt_number(c.paper)}" + (f", {c.delta:+.2f}" if c.delta is not None else "") + ")}"
        return ours

    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{esc(table.title)}. {esc(table.note)}}}",
             r"\begin{tabular}{l" + "c" * len(table.columns) + "}", r"\toprule",
             "Model & " + " & ".join(esc(c.header) for c in table.columns) + r" \\", r"\midrule"]
    lines += [esc(row_label(row)).replace("d\\_v", "$d_v$") + " & " +
              " & ".join(cell_text(table.cells[row, c.key]) for c in table.columns) + r" \\" for row in table.rows]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def csv_text(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["table", "row", "column", "mean", "std", "n_seeds", "marker", "paper", "delta", "rank"])
    for row in table.rows:
        for col in table.columns:
            c = table.cells[row, col.key]
            writer.writerow([table.name, row, col.key, c.mean, c.std, c.n, c.marker or "", c.paper, c.delta,
                             c.rank or ""])
    return out.getvalue()


def html_table(table: Table) -> str:
    def cell_html(c: Cell) -> str:
        ours = html.escape(ours_text(c))
        ours = f"<b>{ours}</b>" if c.rank == 1 else f"<u>{ours}</u>" if c.rank == 2 else ours
        cls = ' class="missing"' if c.mean is None else ""
        paper = f'<br><small>{html.escape(_paper(c))}</small>' if c.paper is not None else ""
        return f"<td{cls}>{ours}{paper}</td>"
    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in table.columns)
    body = "".join(f"<tr><th>{html.escape(row_label(row))}</th>"
                   + "".join(cell_html(table.cells[row, c.key]) for c in table.columns) + "</tr>" for row in table.rows)
    return (f"<h2>{html.escape(table.title)}</h2><table><tr><th>Model</th>{head}</tr>{body}</table>"
            f"<p class=note>{html.escape(table.note)}</p>")


def html_page(experiment: str, tables: list[Table], figures: list[str], summary: str) -> str:
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
             "padding:4px 8px;text-align:center}td.missing{color:#a00}small{color:#666}.note{color:#555}")
    images = "".join(f'<figure><img src="{f}" width="900"><figcaption>{f}</figcaption></figure>' for f in figures)
    return (f"<!doctype html><html><head><meta charset=utf-8><title>ddl report: {html.escape(experiment)}</title>"
            f"<style>{style}</style></head><body><h1>ddl report: {html.escape(experiment)}</h1>"
            f"<p>{html.escape(summary)}</p>" + "".join(html_table(t) for t in tables) +
            f"<h2>Figure 2: loss curves</h2>{images}</body></html>")
