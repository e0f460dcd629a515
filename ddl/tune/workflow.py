"""What a search does next, and what a row's verdict is: the decisions the sweep's driver (ddl.launch.tuning)
takes over the store's trials and the simulator (ddl.tune.simulate) takes over synthetic ones, so that the
simulated workflow is the real one.

A row is searched `tune.replicates` times, independently (replicate r: its own TPE draws and its own seeds,
ddl.tune.config). Each replicate's search asks `tune.trials` trials, `tune.parallel` at a time, resumes its stopped
ones, then brackets its best (ddl.tune.bracket); then each replicate's best runs at fresh seeds, look by look
(ddl.tune.sequential), paired with the baseline's replicate of the same number and seeds. A row whose best any
replicate left unbracketed has no verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .bracket import Edge, open_edges
from .config import TuneConfig
from .search import ask, points
from ..stats import BETTER, NOT_RESOLVED, WORSE
from .sequential import FAILED, Look
from .space import Dimension

NOT_BRACKETED = "not bracketed"


@dataclass
class Round:
    """A replicate's next round: new trials (their values), stopped trials to resume as they were, pruned trials
    to finish with the pruner off (its bracket); `waiting` while another launch or home trains some of its trials.
    A round with none of these is the end of the search: `open` holds the edges no trial brackets."""
    new: list[dict] = field(default_factory=list)
    resume: list = field(default_factory=list)
    finish: list = field(default_factory=list)
    waiting: bool = False
    bracketing: bool = False       # its new trials bracket the best (their values may lie beyond the range)
    open: list[Edge] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not (self.new or self.resume or self.finish or self.waiting)


def next_round(trials, space: list[Dimension], cfg: TuneConfig, replicate: int, parallel: int,
               refused=()) -> Round:
    """The replicate's next round, from its trials as the store (or the simulator) holds them; `refused`: bracket
    values the key cannot take (the driver's plan refused them), whose edge stays open."""
    trials = [t for t in trials if t.role == "trial"]
    stopped = [t for t in trials if t.state == "stopped"]
    waiting = any(t.state == "running" for t in trials)
    wanted = min(cfg.trials, points(space) or cfg.trials)
    if len(trials) < wanted:
        new = ask(trials, space, cfg, min(parallel, wanted - len(trials)), replicate)
        if new or stopped or waiting:
            return Round(new=new, resume=stopped, waiting=waiting)
        wanted = len(trials)         # the sampler draws nothing new: the search has its trials, and brackets its best
    if stopped or waiting:
        return Round(resume=stopped, waiting=waiting)
    edges = open_edges(trials, space)
    budget = cfg.bracket_trials - (len(trials) - wanted)
    tried = [t.values for t in trials] + list(refused)
    new = [e.values for e in edges if e.values is not None and e.values not in tried][:max(0, budget)]
    finish = [e.resume for e in edges if e.resume is not None]
    if new or finish:
        return Round(new=new, finish=finish, bracketing=True)
    return Round(open=edges)


def confirmed(runs, best: dict, seeds) -> dict:
    """{seed: final loss} of a replicate's confirmation runs at its best values over `seeds`, each that ended; one
    that diverged or failed counts, at FAILED (ddl.tune.sequential), never dropped."""
    return {t.seed: t.value if t.state == "complete" else FAILED for t in runs
            if t.role == "confirm" and t.values == best and t.seed in seeds and t.state != "running"}


def verdict(found: Look | None, bracketed: bool) -> str:
    """A row's verdict against its tuned baseline: lower loss is better; a failed confirmation run of the row blocks
    "better" (of the baseline, "worse"), saying which."""
    if not bracketed:
        return NOT_BRACKETED
    if found is None:
        return ""
    failures = "; ".join(filter(None, (found.arm_failed, found.reference_failed)))
    said = found.difference.verdict(False) if found.difference is not None else NOT_RESOLVED
    if (said == BETTER and found.arm_failed) or (said == WORSE and found.reference_failed):
        said = NOT_RESOLVED
    if found.difference is None and not failures:
        return ""
    return f"{said} ({failures})" if failures else said
