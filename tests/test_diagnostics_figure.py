"""The report's Delta diagnostics figure: beta by layer, and the state's effective rank only where a run has one."""

import re

import pandas as pd

from ddl.report.figures import layer_diagnostics


def _run(row: str, seed: int, layers: int, erank: bool) -> dict:
    """One finished run as ddl.track.query hands it over: its params and the latest value of each metric."""
    metrics = {f"metrics.beta/L{i:02d}.{part}/mean": 0.5 + 0.1 * i for i in range(layers) for part in ("attn", "mlp")}
    if erank:
        metrics |= {f"metrics.erank/L{i:02d}": 1.5 + 0.2 * i for i in range(layers)}
    return {"run_id": f"{row}-{seed}", "row": row, "status": "FINISHED", "params.model.size": "micro",
            "params.seed": str(seed), **metrics}


def _panels(out_dir, rows: list[dict]) -> int:
    names = layer_diagnostics(pd.DataFrame(rows), "micro", out_dir)
    assert names == ["diagnostics_micro.png", "diagnostics_micro.svg"]
    return len(set(re.findall(r'<g id="axes_(\d+)"', (out_dir / "diagnostics_micro.svg").read_text())))


def test_without_a_run_of_d_v_above_1_the_figure_has_the_beta_panel_only(tmp_path):
    runs = [_run("ddl_dv1", 0, 3, erank=False), _run("ddl_dv1", 1, 3, erank=False)]
    assert _panels(tmp_path, runs) == 1


def test_a_run_of_d_v_above_1_adds_the_effective_rank_panel(tmp_path):
    runs = [_run("ddl_dv1", 0, 3, erank=False), _run("ddl_dv4", 0, 3, erank=True)]
    assert _panels(tmp_path, runs) == 2
