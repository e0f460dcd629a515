"""The learning-rate transfer table (ddl.report.transfer) on synthetic runs and the slope it fits
(ddl.stats.slope): pure functions, no training."""

import math

import pandas as pd
import pytest

from ddl.report import transfer
from ddl.stats import slope

LRS = [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]


def runs(best: dict[int, float], axis_col: str, seeds: int = 2, fixed: dict | None = None) -> pd.DataFrame:
    """Finished runs of one row over LRS at each axis value: a parabola in log2 lr with its minimum at best[value],
    a seed's offset shared by its lrs."""
    fixed = fixed or {"params.model.d_model": "64", "params.model.n_layer": "2", "params.train.steps": "128"}
    records = []
    for value, lr_star in best.items():
        for seed in range(seeds):
            for lr in LRS:
                loss = 2.0 + 0.05 * (math.log2(lr) - math.log2(lr_star)) ** 2 + 0.001 * seed
                records.append({**fixed, axis_col: str(value), "params.train.lr": str(lr), "params.seed": str(seed),
                                "params.model.row": "ddl_dv4", "params.model.param": "mup", "status": "FINISHED",
                                "metrics.final/val/loss": loss})
    return pd.DataFrame(records)


def test_the_axis_is_the_one_that_varies():
    assert transfer.transfer_axis(runs({64: 8e-3, 128: 8e-3}, "params.model.d_model")) == "width"
    assert transfer.transfer_axis(runs({2: 8e-3, 4: 4e-3}, "params.model.n_layer")) == "depth"
    assert transfer.transfer_axis(runs({64: 8e-3, 256: 4e-3}, "params.train.steps")) == "horizon"
    both = runs({64: 8e-3, 128: 8e-3}, "params.model.d_model")
    assert transfer.transfer_axis(both.assign(**{"params.model.n_layer": both["params.model.d_model"]})) is None
    one_lr = runs({64: 8e-3, 128: 8e-3}, "params.model.d_model")
    assert transfer.transfer_axis(one_lr[one_lr["params.train.lr"] == str(8e-3)]) is None


def test_the_table_counts_factor_2_steps_and_seeds_and_the_vertex_finds_an_off_grid_optimum():
    table = transfer.transfer_table(runs({2: 8e-3, 4: 4e-3, 8: 2 ** -7.5}, "params.model.n_layer"), "depth")
    assert list(table["value"]) == [2, 4, 8] and list(table["steps"]) == [0, -1, -1]   # 2^-7.5: argmin 4e-3, not 8e-3
    assert list(table["seeds"]) == [2, 2, 2] and list(table["neighbour_seeds"]) == [2, 2, 2]
    assert table["vertex"].iloc[0] == pytest.approx(8e-3) and table["vertex"].iloc[2] == pytest.approx(2 ** -7.5)
    assert table["edge"].tolist() == [False, False, False] and set(table["line"]) == {"DDL (d_v=4) mup"}
    [summary] = transfer.summaries(table)
    assert summary.startswith("DDL (d_v=4) mup: -1 factor-2 steps from depth 2 to 8 (0.008 -> 0.004); best lr ∝ depth^")


def test_a_best_at_the_grid_edge_is_marked_and_kept_as_the_vertex():
    table = transfer.transfer_table(runs({64: 8e-3, 128: 1e-3}, "params.model.d_model"), "width")
    assert table["edge"].tolist() == [False, True] and table["vertex"].iloc[1] == 2e-3
    assert "(a best at the edge of its grid)" in transfer.summaries(table)[0]
    alone = transfer.transfer_table(runs({64: 8e-3}, "params.model.d_model"), "width")
    assert transfer.summaries(alone) == ["DDL (d_v=4) mup: only width 64 measured (best lr 0.008)"]


def test_the_base_width_multipliers_make_lines_of_their_own():
    plain = runs({64: 8e-3, 256: 8e-3}, "params.model.d_model")              # logged before the multipliers existed
    logged = runs({64: 8e-3, 256: 8e-3}, "params.model.d_model").assign(**{"params.model.logit_mult": "1",
                                                                           "params.model.embed_lr_mult": "1.0"})
    scaled = runs({64: 8e-3, 256: 2e-3}, "params.model.d_model").assign(**{"params.model.logit_mult": "4.0",
                                                                           "params.model.embed_lr_mult": "0.25"})
    table = transfer.transfer_table(pd.concat([plain, logged, scaled]), "width")
    assert list(table["line"]) == ["DDL (d_v=4) mup"] * 2 + ["DDL (d_v=4) mup logits x4 embedding lr x0.25"] * 2
    assert list(table["seeds"]) == [4, 4, 2, 2] and list(table["steps"]) == [0, 0, 0, -2]


def test_the_report_writes_the_table_and_the_figure(tmp_path):
    table, figures = transfer.write(runs({64: 8e-3, 256: 4e-3}, "params.train.steps"), "nats", tmp_path)
    assert len(table) == 2 and "lr_transfer.png" in figures
    assert (tmp_path / "lr_transfer.png").read_bytes()[:4] == b"\x89PNG"
    assert "### The best learning rate along horizon" in (tmp_path / "lr_transfer.md").read_text()
    assert pd.read_csv(tmp_path / "lr_transfer.csv")["best_lr"].tolist() == [8e-3, 4e-3]


def test_the_slope_and_its_interval():
    exact = slope([0.0, 1.0, 2.0, 3.0], [1.0, 0.5, 0.0, -0.5])
    assert exact.value == pytest.approx(-0.5) and exact.low == pytest.approx(-0.5) and exact.high == pytest.approx(-0.5)
    noisy = slope([0.0, 1.0, 2.0, 3.0], [0.1, -0.1, 0.1, -0.1])
    assert noisy.low < 0 < noisy.high
    assert slope([0.0, 1.0], [0.0, 2.0]).low is None

