"""The verdict at equal compute: a row against its baseline when both have spent the same compute, not the same
tokens. Pure but for pandas.

A row's cost a token over its baseline's is `ddl.costs.cost_ratio` in a measure (training FLOPs: 6 N plus the Delta
update's own; or a device's measured step time). At the cheaper row's total, the costlier row is read off its own
validation curve, at the step where its cumulative cost reaches that total (linear between validations): mid-way
through its schedule, its learning rate not yet decayed, which favours the cheaper row. The cheaper row stopped
early: it had compute left. Where the store holds the cheaper row trained for the costlier row's whole compute (its
steps times the ratio: `+sweep=iso_compute`), the comparison is made there instead, both rows at the end of their
schedules: measured, not read off a curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import pandas as pd

from ..costs import COMPUTE_MEASURES, cost_ratio
from ..model.config import CHANNEL_CONVS, DEFAULT_TIME_KERNEL
from ..stats import Difference, paired

STEPS = "params.train.steps"
LOSS = "metrics.final/val/loss"


class UnknownCost(ValueError):
    """A measure with no figure for a row's arm: one line naming them."""


@dataclass
class AtCompute:
    difference: Difference | None
    ratio: float | None           # the row's cost a token over its baseline's (None: a run logged no size)
    how: str                      # how it was read: measured, or off which curve at which step


def _int(run: pd.Series, key: str, default: int) -> int:
    value = run.get(f"params.model.{key}")       # absent, NaN, or "None" as MLflow logs a null
    return default if value in (None, "None") or (isinstance(value, float) and math.isnan(value)) else int(value)


def model_of(run: pd.Series) -> SimpleNamespace:
    """What ddl.costs reads of a model, from a run's params (a knob a run did not log: its default then)."""
    text = {k: run.get(f"params.model.{k}") for k in ("residual", "conv", "mapping", "beta_estimator")}
    defaults = {"residual": "baseline", "conv": "none", "mapping": "k", "beta_estimator": "linear"}
    model = SimpleNamespace(**{k: v if isinstance(v, str) else defaults[k] for k, v in text.items()},
                            dv=_int(run, "dv", 1), n_h=_int(run, "n_h", 1), n_layer=_int(run, "n_layer", 1),
                            d_model=_int(run, "d_model", 1))
    channel_conv = model.conv in CHANNEL_CONVS          # ModelConfig.state_kernel's rule for a null kernel
    model.state_kernel = _int(run, "state_conv_kernel", model.dv if channel_conv else DEFAULT_TIME_KERNEL)
    return model


def param_count(run: pd.Series) -> int | None:
    """The run's logged parameter count; None for a run that logged none (imported, or logged by hand)."""
    value = run.get("params.model.params")
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def ratio(row: pd.Series, base: pd.Series, measure: str) -> float | None:
    """A row's cost a token over its baseline's; None where either logged no parameter count; UnknownCost where the
    measure has no figure for its arm."""
    if param_count(row) is None or param_count(base) is None:
        return None
    found = cost_ratio(model_of(row), model_of(base), param_count(row), param_count(base), measure)
    if found is None:
        raise UnknownCost(f"--compute={measure}: no {COMPUTE_MEASURES[measure]} is recorded for "
                          f"{row['params.model.row']} (ddl/costs.py); use --compute flops, or bench that arm")
    return found


def check_measure(runs: pd.DataFrame, measure: str) -> None:
    """UnknownCost, before anything is written, where the measure cannot price a row of the runs."""
    if measure not in COMPUTE_MEASURES:
        raise UnknownCost(f"--compute={measure}: must be one of {', '.join(COMPUTE_MEASURES)}")
    for _, run in runs.drop_duplicates("params.model.row").iterrows():
        ratio(run, run, measure)


def curve_at(histories: pd.DataFrame, run_id: str, step: float) -> float | None:
    """A run's validation loss at a step, linear between its validations; None before its first one."""
    points = histories[(histories["run_id"] == run_id) & (histories["key"] == "val/loss")].sort_values("step")
    below, above = points[points["step"] <= step], points[points["step"] >= step]
    if below.empty or above.empty:
        return None
    (s0, v0), (s1, v1) = below[["step", "value"]].iloc[-1], above[["step", "value"]].iloc[0]
    return float(v0) if s1 == s0 else float(v0 + (v1 - v0) * (step - s0) / (s1 - s0))


def _per_seed(runs: pd.DataFrame) -> pd.DataFrame:
    done = runs[(runs["status"] == "FINISHED") & runs[LOSS].notna()] if LOSS in runs else runs.iloc[:0]
    return done.drop_duplicates("params.seed").set_index("params.seed")


def _read(runs: pd.DataFrame, histories: pd.DataFrame, step: float) -> dict:
    """{seed: val/loss at `step`} of each finished run that has it."""
    found = {seed: curve_at(histories, run["run_id"], step) for seed, run in _per_seed(runs).iterrows()}
    return {seed: value for seed, value in found.items() if value is not None}


def _final(runs: pd.DataFrame) -> dict:
    return {seed: float(run[LOSS]) for seed, run in _per_seed(runs).iterrows()}


def at_equal_compute(row: pd.DataFrame, base: pd.DataFrame, histories: pd.DataFrame, measure: str,
                     longer: pd.DataFrame | None = None, confidence: float = 0.95,
                     unit=None) -> AtCompute | None:
    """The row's runs against its baseline's at equal compute (`unit`: groups the per-seed values into the
    comparison's units, e.g. replicates; None: by seed). `longer`: runs that differ from the cheaper row's only in
    their steps, where the cheaper row may have been trained for the costlier one's compute."""
    if row.empty or base.empty:
        return None
    r = ratio(row.iloc[0], base.iloc[0], measure)
    if r is None:
        return AtCompute(None, None, "a run logged no parameter count (params.model.params)")
    steps = int(row.iloc[0][STEPS])
    costlier, cheaper, sign = (row, base, 1) if r >= 1 else (base, row, -1)
    cheaper_name = "the baseline" if sign == 1 else "the row"
    factor = r if r >= 1 else 1 / r
    if factor == 1.0:                                    # one cost (the same arm): equal compute is equal tokens
        return AtCompute(_diff(_final(costlier), _final(cheaper), sign, confidence, unit), r,
                         "one cost: as at equal tokens")
    wanted = steps * factor
    if longer is not None and not longer.empty:
        match = longer[(pd.to_numeric(longer[STEPS]) - wanted).abs() <= max(1.0, 0.005 * wanted)]
        if not match.empty:
            a, b = _final(costlier), _final(match)
            how = (f"measured: {cheaper_name} trained {int(match.iloc[0][STEPS])} steps, the compute of the other's "
                   f"{steps}")
            return AtCompute(_diff(a, b, sign, confidence, unit), r, how)
    at = steps / factor
    a, b = _read(costlier, histories, at), _final(cheaper)
    how = (f"{cheaper_name} stopped early (at {100 / factor:.1f}% of the other's compute): the other read at step "
           f"{at:.0f} of {steps} of its curve")
    if not a:
        how += " (no validation loss on both sides of that step: a smaller train.eval_every logs one)"
    return AtCompute(_diff(a, b, sign, confidence, unit), r, how)


def _diff(costlier: dict, cheaper: dict, sign: int, confidence: float, unit) -> Difference | None:
    """row - baseline: costlier - cheaper when the row is the costlier (sign 1), else the reverse."""
    arm, reference = (costlier, cheaper) if sign == 1 else (cheaper, costlier)
    shared = set(arm) & set(reference)
    arm, reference = ({k: v for k, v in d.items() if k in shared} for d in (arm, reference))
    if unit is not None:
        arm, reference = unit(arm), unit(reference)
    return paired(arm, reference, confidence)
