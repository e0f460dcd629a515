"""µP's coordinate check (ddl.coord, Yang et al. 2022): every row trained 3 AdamW steps at lr 1e-2 at
widths 64 and 256, under sp and mup. Under mup every layer group's activations keep their size as the
width grows 4x; under sp the logits grow with it. Measured on a 2-core VM (2026-11-26), width 256 over
64: under mup the hidden groups 0.74-1.16 at every step, the logits 0.93-0.99 and the gate's logit
0.67-0.75 at step 3; under sp the logits 2.8-3.7x and the baseline's block outputs 7.4x. The check
fails when µP is switched off, wholly (the mup arm built as sp: its logits grow 2.8x) or in part:
without the logits' 1/m (2.9-3.3x), without Adam's lr / m (the baseline's block outputs 10x), without
the value's sqrt(m) (DDL's state 0.44-0.55x), without the init factors (d_v=4's state readout at step
0, 0.58x)."""

import pandas as pd
import pytest

from ddl.coord import coord_check, flatness, main

STEPS = 3
FLAT = 1.5       # the factor within which a group's abs mean stays from width 64 to 256
GATE_FLAT = 2.0  # the gate's logit: µP's output init gives it O(1/sqrt(width)) at step 0, still outgrown at step 3
SP_GROWTH = 2.4  # sp's logits: sqrt(4) = 2 from the init alone, more once trained


@pytest.fixture(scope="module")
def ratios():
    return flatness(coord_check(widths=(64, 256), steps=STEPS, seeds=1)).set_index(["param", "row", "group", "step"])


@pytest.mark.slow
def test_under_mup_every_layer_group_is_flat_in_width(ratios):
    mup = ratios.loc["mup"].reset_index()
    # the hidden groups at every step, the init included; the readouts (logits, the gate) once trained
    checked = mup[mup["group"].isin(["embedding", "block", "readout"]) | (mup["step"] == STEPS)]
    off = [f"{r.row} {r.group} step {r.step}: {r.ratio:.2f}x" for r in checked.itertuples()
           if not 1 / (bound := GATE_FLAT if r.group == "beta" else FLAT) < r.ratio < bound]
    assert not off, f"not flat in width under mup (width 256 / 64): {'; '.join(off)}"
    assert set(checked["group"]) == {"embedding", "block", "readout", "beta", "logits"}


@pytest.mark.slow
def test_under_sp_the_logits_grow_with_width(ratios):
    logits = ratios.xs(("sp", "logits", STEPS), level=("param", "group", "step"))["ratio"]
    assert len(logits) == 3 and (logits > SP_GROWTH).all(), logits.to_dict()
    assert ratios.loc[("sp", "baseline", "block", STEPS), "ratio"] > 3          # and the hidden activations blow up


@pytest.mark.parametrize("flags, shown", [(["--widths", "64,48"], "--widths='64,48': must be two or more"),
                                          (["--widths", "0,64"], "--widths='0,64': must be two or more"),
                                          (["--steps", "0"], "--steps=0: must be an integer >= 1"),
                                          (["--lr", "-1"], "--lr=-1.0: must be a number > 0")])
def test_bad_flags_are_one_line_and_exit_2(flags, shown, capsys, tmp_path):
    assert main([*flags, "--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and shown in out and not any(tmp_path.iterdir())


@pytest.mark.slow
def test_the_command_writes_the_table_and_the_figure(tmp_path, capsys):
    assert main(["--widths", "32,64", "--steps", "1", "--seeds", "1", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "coord.csv")
    assert list(table.columns) == ["param", "row", "width", "step", "layer", "abs_mean"]
    assert set(table["param"]) == {"sp", "mup"} and set(table["width"]) == {32, 64} and set(table["step"]) == {0, 1}
    assert {"embedding", "block0", "block1", "readout", "beta.L01.mlp", "logits"} <= set(table["layer"])
    assert (tmp_path / "coord.png").read_bytes()[:4] == b"\x89PNG"
    assert "written:" in capsys.readouterr().out
