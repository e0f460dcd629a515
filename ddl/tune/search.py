"""One row's search through Optuna's ask-and-tell: the study is rebuilt, in memory, from the trials the
store holds (ddl.track.searches), so the store alone is the search's state. TPE proposes the next
values (its first trials at random, then from the model; `constant_liar` keeps trials asked together
apart); a space of `choice(...)` keys alone is walked as a grid, in a seeded order, each point once.
The pruner is Optuna's MedianPruner, asked by the trial itself at each of its validations, except for a trial
next to the search's current best (no completed trial between them): those always finish, so that what brackets
the best is never the pruner's call on an early loss (a low learning rate starts slow).
"""

from __future__ import annotations

import itertools
import random

from .config import REPLICATE_STRIDE, TuneConfig
from .space import Dimension, numeric


def _optuna():
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _frozen(trial, space: list[Dimension]):
    """A stored trial as Optuna's FrozenTrial: complete with its loss, pruned with its curve, running
    (asked by another launch or home, still training), or failed (diverged)."""
    optuna = _optuna()
    from optuna.trial import TrialState
    states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "running": TrialState.RUNNING,
              "failed": TrialState.FAIL, "stopped": TrialState.RUNNING}
    known = [d for d in space if d.key in trial.values]
    return optuna.trial.create_trial(
        state=states[trial.state], value=trial.value if trial.state == "complete" else None,
        params={d.key: _param(d, trial.values[d.key]) for d in known},
        distributions={d.key: d.distribution() for d in known}, intermediate_values=dict(trial.curve))


def _param(dim: Dimension, value):
    return str(value) if dim.categorical else value


def study(trials, space: list[Dimension], cfg: TuneConfig, replicate: int = 0):
    """The search's study rebuilt from its stored trials. TPE's seed moves on with the history, so that the same
    history asks the same next trials while a later round draws afresh (one seed for every round would draw
    the same values again); each replicate of a row draws from its own seeds. A trial the bracket put beyond
    the range is left out: TPE's distributions end at the range."""
    optuna = _optuna()
    startup = max(2, min(cfg.trials // 3, 10))
    sampler = optuna.samplers.TPESampler(seed=cfg.sampler_seed + REPLICATE_STRIDE * replicate + len(trials),
                                         n_startup_trials=startup, multivariate=True, constant_liar=True)
    found = optuna.create_study(direction="minimize", sampler=sampler)
    for trial in trials:
        if all(d.contains(trial.values[d.key]) for d in space if d.key in trial.values):
            found.add_trial(_frozen(trial, space))
    return found


def ask(trials, space: list[Dimension], cfg: TuneConfig, n: int, replicate: int = 0) -> list[dict]:
    """The searched values of the next `n` trials, given the search's stored trials."""
    if all(d.categorical for d in space):
        return _grid_points(trials, space, cfg.sampler_seed + REPLICATE_STRIDE * replicate)[:n]
    asked = study(trials, space, cfg, replicate)
    distributions = {d.key: d.distribution() for d in space}
    tried, found = [t.values for t in trials], []
    for _ in range(10 * n):           # a value tried before is that trial's signature: it would resume it
        if len(found) == n:
            break
        params = asked.ask(distributions).params
        if params not in tried and params not in found:
            found.append(params)
    return found


def points(space: list[Dimension]) -> int | None:
    """The number of distinct values of a space of `choice(...)` keys and integer ranges; None with a continuous
    range."""
    size = 1
    for d in space:
        if not (d.categorical or d.integer):
            return None
        size *= len(d.choices) if d.categorical else int(d.high) - int(d.low) + 1
    return size


def _grid_points(trials, space: list[Dimension], seed: int) -> list[dict]:
    keys = [d.key for d in space]
    points = [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(d.choices for d in space))]
    random.Random(seed).shuffle(points)
    tried = [{k: str(v) for k, v in t.values.items()} for t in trials]
    return [p for p in points if p not in tried]


def should_prune(trials, curve: dict[int, float], steps: int, cfg: TuneConfig, values: dict) -> bool:
    """Optuna's MedianPruner on this trial's val/loss curve so far (step -> loss) against the search's
    completed trials at the same step, after `prune_warmup` of the steps and two completed trials; never for a
    trial (at `values`) next to the search's current best."""
    optuna = _optuna()
    from optuna.trial import TrialState
    if cfg.pruner == "none" or beside_best(values, trials):
        return False
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=int(cfg.prune_warmup * steps))
    peers = optuna.create_study(direction="minimize")
    for trial in trials:
        if trial.state == "complete" and trial.role == "trial":
            peers.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=trial.value,
                                                      intermediate_values=dict(trial.curve)))
    current = optuna.trial.create_trial(state=TrialState.RUNNING, intermediate_values=dict(curve))
    return pruner.prune(peers, current)


def beside_best(values: dict, trials) -> bool:
    """Whether no completed trial lies between `values` and the best completed trial's, along each numeric key:
    such a trial may bracket the best, and the pruner leaves it to finish."""
    complete = [t for t in trials if t.state == "complete" and t.role == "trial"]
    if not complete:
        return False
    best = min(complete, key=lambda t: t.value).values
    for key, value in values.items():
        if not numeric(value) or not numeric(best.get(key)):
            continue
        low, high = sorted((value, best[key]))
        if any(low < t.values[key] < high for t in complete if numeric(t.values.get(key))):
            return False
    return True
