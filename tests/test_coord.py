"""The coordinate check (ddl.coord, Yang et al. 2022) at widths 128 and 512 (m = 2 and 8, base width 64), seed 0:
under mup every judged slope, of |h_0| and of |h_3 - h_0| on the probe batch against the width, lies within 1/8
of µP's (ddl.coord.EXPECTED); with any one factor of µP off by m^(+-1/4) (ddl.model.mup.skewed) the check fails.
The init factors, the logits' and the value's show at the init (no training: a few seconds); the two lr factors
need the three steps (the hidden lr in the baseline's blocks, the output lr in DDL's gate and value map).
Measured on a 2-core VM (2026-11-26): the reference's judged slopes within 0.07 of the expected; each skew moves
one judged slope or more 0.14-0.30 from it."""

import pandas as pd
import pytest

from ddl.coord import coord_check, failures, main, slopes
from ddl.model.mup import skewed
from tests.conftest import slow_except

WIDTHS, STEPS = (128, 512), 3
BOTH = ("baseline", "ddl_dv4")


def judged(steps: int, rows=BOTH) -> list[str]:
    return failures(slopes(coord_check("width", WIDTHS, steps, 1e-2, 1, rows, ("mup",))))


def test_under_mup_the_init_is_mups():
    assert judged(0) == []


@pytest.mark.slow
def test_under_mup_every_judged_slope_is_mups_after_three_steps():
    assert judged(STEPS) == []


SEEN_AT_INIT = {f"{name}{power:+g}": (name, power) for name in ("output_init", "vector_init", "logits", "value")
                for power in (0.25, -0.25)}


@pytest.mark.parametrize("skew", slow_except(SEEN_AT_INIT, "value+0.25"))
def test_an_init_factor_off_by_a_fourth_root_of_m_fails_the_check(skew):
    with skewed(*skew):
        assert judged(0), f"{skew}: every slope within the tolerance"


@pytest.mark.slow
@pytest.mark.parametrize("skew, row", [(("hidden_lr", 0.25), "baseline"), (("hidden_lr", -0.25), "baseline"),
                                       (("output_lr", 0.25), "ddl_dv4"), (("output_lr", -0.25), "ddl_dv4")])
def test_an_lr_factor_off_by_a_fourth_root_of_m_fails_the_check(skew, row):
    with skewed(*skew):
        assert judged(STEPS, (row,)), f"{skew}: every slope within the tolerance"


@pytest.mark.parametrize("flags, shown", [(["--widths", "64,48"], "--widths='64,48': must be two or more"),
                                          (["--widths", "0,64"], "--widths='0,64': must be two or more"),
                                          (["--depths", "4"], "--depths='4': must be two or more different positive"),
                                          (["--rows", "ddl_dv3"], "--rows='ddl_dv3': must be one or more of baseline"),
                                          (["--arms", "completep"], "--arms='completep': must be one or more of sp"),
                                          (["--skew", "hidden_lr"], "--skew='hidden_lr': must be FACTOR=POWER"),
                                          (["--steps", "0"], "--steps=0: must be an integer >= 1"),
                                          (["--lr", "-1"], "--lr=-1.0: must be a number > 0")])
def test_bad_flags_are_one_line_and_exit_2(flags, shown, capsys, tmp_path):
    assert main([*flags, "--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and shown in out and not any(tmp_path.iterdir())


@pytest.mark.slow
def test_across_depth_every_variant_writes_its_internals_the_slopes_and_the_figure(tmp_path, capsys):
    assert main(["--depths", "2,3", "--steps", "1", "--seeds", "1", "--arms", "completep", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "coord.csv")
    assert list(table.columns) == ["arm", "row", "depth", "step", "layer", "abs_mean", "delta"]
    assert set(table["depth"]) == {2, 3} and set(table["step"]) == {0, 1} and len(set(table["row"])) == 10
    assert (table[table["step"] == 0]["delta"] == 0).all() and (table[table["step"] == 1]["delta"] > 0).any()
    nh2 = set(table[table["row"] == "ddl_dv4_nh2"]["layer"])
    assert {"beta.L00.attn.j2", "write.L02.mlp", "ktx.L02.mlp", "v.L01.attn", "readout", "logits"} <= nh2
    assert "gatemap.L00.attn" not in set(table[table["row"] == "ddl_dv4_mlp_gate"]["layer"])   # an MLP gate: no map
    assert set(pd.read_csv(tmp_path / "coord_slopes.csv")["group"]) >= {"block", "write", "ktx", "vmap", "gatemap"}
    assert (tmp_path / "coord.png").read_bytes()[:4] == b"\x89PNG"
    assert "written:" in capsys.readouterr().out
