"""Is a search's best bracketed? Its optimum is only an optimum when finished trials lie on both sides of it.

Along each numeric searched key, the best completed trial is bracketed below when a finished trial has a lower
value of that key (whatever its other keys), and above likewise; a trial that diverged (failed on a non-finite
loss) counts as finished, at an infinite loss. An edge that is not bracketed gets one more trial there: the nearest
trial on that side the pruner stopped, finished from its checkpoint with the pruner off, or else a new trial at the
best's values with that key a bracket step (a fifth of the range) beyond, past the range's end if need be. A search
adds at most `tune.bracket_trials` new trials so; a best still unbracketed then has no verdict ("not bracketed").
Pure: the trials are the store's (ddl.track.searches.Trial) or the simulator's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .space import Dimension

FINISHED = ("complete", "failed")     # a trial whose loss is known (failed: diverged, an infinite loss)


@dataclass(frozen=True)
class Edge:
    key: str
    side: str                          # below | above
    resume: object | None = None       # the pruned trial to finish, or
    values: dict | None = None         # ... a new trial's values

    def __str__(self) -> str:
        return f"{self.key} {self.side}"


def best(trials):
    complete = [t for t in trials if t.state == "complete" and t.role == "trial"]
    return min(complete, key=lambda t: t.value) if complete else None


def open_edges(trials, space: list[Dimension]) -> list[Edge]:
    """The edges of the best that no finished trial brackets, each with what would bracket it."""
    found = best(trials)
    if found is None:
        return []
    edges = []
    for dim in space:
        if dim.categorical:
            continue
        x = found.values[dim.key]
        for side, beyond in (("below", lambda v, x=x: v < x), ("above", lambda v, x=x: v > x)):
            others = [t for t in trials if t.role == "trial" and beyond(t.values[dim.key])]
            if any(t.state in FINISHED for t in others):
                continue
            pruned = [t for t in others if t.state == "pruned"]
            if pruned:
                nearest = min(pruned, key=lambda t: abs(t.values[dim.key] - x))
                edges.append(Edge(dim.key, side, resume=nearest))
                continue
            sign = -1 if side == "below" else 1
            value = dim.unscale(dim.scale(x) + sign * dim.bracket_step())
            if value == x:                 # an integer key rounded back to the best: one integer beyond it
                value = x + sign
            edges.append(Edge(dim.key, side, values={**found.values, dim.key: value}))
    return edges
