"""The paper's numbers as the project ships them (`ddl/report/paper_tables.csv`: Tables 1-3, one value a row), read
with the standard library: the report's tables load them into pandas, the plan reads the validation losses here
without importing it."""

from __future__ import annotations

import csv
import functools
from importlib import resources


def table_file():
    """The CSV, as an importlib resource (it ships inside the package)."""
    return resources.files("ddl.report").joinpath("paper_tables.csv")


@functools.lru_cache(maxsize=None)
def val_losses() -> dict[tuple[str, str], float]:
    """{(size, row): the paper's final validation loss} (Table 3; FineWeb-Edu in GPT-2 tokens)."""
    with table_file().open() as f:
        return {(r["size"], r["model"]): float(r["value"]) for r in csv.DictReader(f) if r["metric"] == "val_loss"}
