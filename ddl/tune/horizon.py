"""A learning rate carried to a size that trains for another number of tokens (tune.search_size): the horizon
rule. Pure Python.

The best lr of a run falls as it trains longer, in any parameterization (µP's transfer is a statement at a fixed
horizon). With `tune.horizon_exponent` = gamma, a carried `train.lr` is multiplied by (T_to / T_from)^-gamma, T a
run's tokens (steps x batch tokens), so that best lr ∝ T^-gamma; without one, a carry across more than
`tune.max_horizon_ratio` times the tokens is refused: its lr would be a guess. What was measured, per row:
sweeps/transfer_horizon.yaml, docs/results.md.
"""

from __future__ import annotations

LR = "train.lr"       # the key the rule moves; other searched keys carry as they are


def tokens(run) -> int:
    """A run's training tokens (a RunConfig's steps times its batch)."""
    return run.train.steps * run.train.batch_tokens


def carry_factors(source, target, keys, exponent: float | None, max_ratio: float | None) -> dict[str, float]:
    """{key: what the carried value is multiplied by} for a row's best values found on the RunConfig `source`
    and run on `target`: train.lr times (T_to / T_from)^-exponent; {} where nothing changes. ValueError (one line)
    for a carry across more than max_ratio times the tokens without an exponent."""
    ratio = tokens(target) / tokens(source)
    if LR not in keys or ratio == 1:
        return {}
    if exponent is None:
        if max_ratio is not None and max(ratio, 1 / ratio) > max_ratio:
            raise ValueError(f"tune.max_horizon_ratio={max_ratio:g}: carrying {LR} from {tokens(source):,} to "
                             f"{tokens(target):,} tokens a run ({ratio:.3g}x) moves the best lr by more than a "
                             f"learning rate found at one horizon tells (docs/results.md); set "
                             f"tune.horizon_exponent (best lr ∝ tokens^-exponent) or search at each size")
        return {}
    return {LR: ratio ** -exponent}
