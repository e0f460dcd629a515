"""Paired seed statistics and what the report claims from them, on synthetic runs (pure functions)."""

import pandas as pd
import pytest

from ddl.report import render
from ddl.stats import BETTER, NOT_RESOLVED, WORSE, paired, seeds_to_resolve, t_quantile
from ddl.report.tables import accuracy_table, loss_table, variant_rows

# Per-seed noise shared by the arms of a seed (same init and data order), larger than the effects.
SEED_NOISE = [0.031, -0.012, 0.024, -0.040, 0.005]


def synthetic_runs(shifts: dict[str, float], seeds: int, **extra) -> pd.DataFrame:
    """Finished runs of each row at the tiny size: loss 1.75 + seed noise + the row's shift (+ a
    small per-run jitter), plus a 0-shot accuracy that is the same for every arm."""
    rows = []
    for number, (row, shift) in enumerate(shifts.items()):
        for seed in range(seeds):
            loss = 1.75 + SEED_NOISE[seed] + shift + 0.001 * ((seed + number) % 3 - 1)
            rows.append({"params.model.row": row, "params.model.size": "tiny", "params.seed": str(seed),
                         "params.data.source": "embedded", "params.train.steps": "300", "status": "FINISHED",
                         "metrics.final/val/loss": loss, "metrics.final/val/ppl": 2.718281828 ** loss,
                         "metrics.eval/0shot/ddl_continuation/reported": 0.45 + SEED_NOISE[seed],
                         "metrics.eval/0shot/ddl_continuation/n": 77.0,
                         "metrics.eval/0shot/ddl_continuation/stderr": 0.0567, **extra})
    runs = pd.DataFrame(rows)
    return runs.assign(row=variant_rows(runs))


def test_t_quantiles_are_students():
    assert t_quantile(2) == pytest.approx(12.706, abs=1e-3) and t_quantile(3) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile(31) == pytest.approx(2.042, abs=1e-3)


def test_paired_difference_cancels_the_seed_noise():
    reference = {str(s): 1.75 + n for s, n in enumerate(SEED_NOISE)}
    arm = {s: v - 0.02 for s, v in reference.items()}
    d = paired(arm, {s: v + 0.001 * (int(s) % 2) for s, v in reference.items()})
    assert d.n == 5 and d.mean == pytest.approx(-0.0204) and d.std == pytest.approx(0.000548, abs=1e-6)
    assert d.verdict(higher_is_better=False) == BETTER and d.verdict(higher_is_better=True) == WORSE
    assert paired({"0": 1.0}, {"1": 1.0}) is None                           # no shared seed: nothing to pair


def test_a_known_better_arm_is_better_with_an_interval_excluding_zero():
    table = loss_table(synthetic_runs({"baseline": 0.0, "ddl_dv4": -0.03}, seeds=3), ["tiny"], "nats/token (byte)")
    cell = table.cells["ddl_dv4", "tiny/val_loss"]
    d = cell.versus
    assert d.n == 3 and d.high < 0 and d.low < d.mean < d.high
    assert d.mean == pytest.approx(-0.03, abs=0.003) and d.verdict(False) == BETTER
    assert cell.rank == 1 and table.cells["baseline", "tiny/val_loss"].rank == 0   # two rows: no "second"
    assert d.relative == pytest.approx(100 * d.mean / table.cells["baseline", "tiny/val_loss"].mean, rel=0.02)
    [(heading, headers, [line])] = list(render.compared(table))
    assert line[:2] == ["DDL (d_v=4)", "3"] and line[4].startswith(f"{BETTER} (could resolve >= ")
    assert "**" in render.markdown(table)
    assert line[headers.index("paper Δ % (small)")] == "-0.66%"              # (2.83545 - 2.85426) / 2.85426


def test_equal_arms_are_not_resolved_and_not_bold():
    table = loss_table(synthetic_runs({"baseline": 0.0, "ddl_dv1": 0.0, "ddl_dv4": 0.0}, seeds=3), ["tiny"], "u")
    for row in ("ddl_dv1", "ddl_dv4"):
        d = table.cells[row, "tiny/val_loss"].versus
        assert d.low < 0 < d.high and d.verdict(False) == NOT_RESOLVED
    assert all(c.rank == 0 for c in table.cells.values())
    assert "**" not in render.markdown(table) and "<u>" not in render.markdown(table)


def test_a_single_seed_gets_no_interval_no_verdict_and_no_bold():
    table = loss_table(synthetic_runs({"baseline": 0.0, "ddl_dv4": -0.3}, seeds=1), ["tiny"], "u")
    cell = table.cells["ddl_dv4", "tiny/val_loss"]
    assert cell.std is None and cell.versus.n == 1 and cell.versus.low is None
    assert cell.versus.verdict(False) == NOT_RESOLVED and cell.rank == 0
    [(_, _, [line])] = list(render.compared(table))
    assert "[" not in line[2] and line[-1] == ""
    assert line[4] == f"{NOT_RESOLVED} (one seed: resolves no gap; the paper's gap at small is -0.66%)"
    grid = [line for line in render.markdown(table).split("####")[0].splitlines() if line.startswith("| ")]
    assert len(grid) == 7 and not any("**" in line or " ± " in line for line in grid)


def test_accuracy_cells_carry_items_and_stderr_and_averages_name_their_tasks():
    runs = synthetic_runs({"baseline": 0.0, "ddl_dv1": 0.0}, seeds=2)
    runs["metrics.eval/0shot/piqa/reported"] = 0.6
    table = accuracy_table(runs, "tiny", 0, ["piqa", "ddl_continuation"])
    md = render.markdown(table)
    assert "(SE 5.67, 77 items)" in md and "SE not logged" in md                # piqa logged no n / stderr
    assert "Avg.: the mean over PIQA, ddl_continuation (2 tasks)." in md
    assert table.cells["ddl_dv1", "average"].mean == pytest.approx(100 * (0.6 + 0.45 + (0.031 - 0.012) / 2) / 2)
    assert "paper Δ" not in md                    # the paper's average covers its eight tasks, not these


def test_paper_values_beside_ours_only_on_the_papers_data():
    runs = synthetic_runs({"baseline": 0.0, "ddl_dv4": -0.03}, seeds=2)
    runs["params.model.size"] = "small"
    embedded = render.markdown(loss_table(runs, ["small"], "u"))
    assert "paper 2.8543" not in embedded and "FineWeb-Edu" not in embedded and "-0.66%" in embedded
    runs["params.data.source"], runs["params.data.tokenizer"] = "fineweb_edu", "gpt2"
    on_its_data = render.markdown(loss_table(runs, ["small"], "u"))
    assert "paper 2.8543" in on_its_data and "Paper values beside runs on its data (FineWeb-Edu" in on_its_data


def test_reused_runs_are_marked_and_pairs_need_the_same_data():
    runs = synthetic_runs({"baseline": 0.0, "ddl_dv4": -0.03}, seeds=2, **{"tags.ddl.history_from": "run123"})
    table = loss_table(runs, ["tiny"], "u")
    md = render.markdown(table)
    assert "1.7" in md and "†" in md and "trained under another experiment's run" in md
    other = synthetic_runs({"baseline": 0.0, "ddl_dv4": -0.03}, seeds=2)
    other.loc[other["params.model.row"] == "baseline", "params.data.source"] = "files"
    other = other.assign(row=variant_rows(other))
    assert loss_table(other, ["tiny"], "u").cells["ddl_dv4", "tiny/val_loss"].versus is None


def test_differences_without_spread_resolve_nothing():
    """Two seeds whose accuracy both moved by the same one item of 77: no interval, no verdict."""
    d = paired({"0": 100 * 20 / 77, "1": 100 * 22 / 77}, {"0": 100 * 21 / 77, "1": 100 * 23 / 77})
    assert d.std == pytest.approx(0, abs=1e-12) and d.low is None and d.verdict(True) == NOT_RESOLVED
    assert seeds_to_resolve(0.0, 1.3) is None


def test_seeds_to_resolve():
    assert seeds_to_resolve(0.01, 0.1) == 2                  # 12.7 * 0.01 / sqrt(2) < 0.1
    assert seeds_to_resolve(0.01, 0.01) == 7                 # t_6 * 0.01 / sqrt(7) = 0.0092
    assert seeds_to_resolve(1.0, 1e-4) is None
