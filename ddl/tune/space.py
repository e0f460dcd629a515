"""A sweep's overrides split into its rows and its search space, in Hydra's own override grammar.

Plain lists (`dv=1,4`, `range(0,3)`) stay the rows, as in any sweep; a key given `interval(a, b)`
(`tag(log, ...)` for a log scale, `int(...)` for integers) or `choice(...)` is searched within each row,
as hydra-optuna-sweeper maps the same grammar onto Optuna's distributions. Pure but for optuna's
distribution classes, imported where they are built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..validation import shown


@dataclass(frozen=True)
class Dimension:
    key: str
    low: float | int | None = None          # interval(low, high)
    high: float | int | None = None
    log: bool = False
    integer: bool = False
    choices: tuple[str, ...] = ()           # choice(...): the override strings

    @property
    def categorical(self) -> bool:
        return bool(self.choices)

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
        if self.categorical:
            return CategoricalDistribution(self.choices)
        if self.integer:
            return IntDistribution(int(self.low), int(self.high), log=self.log)
        return FloatDistribution(float(self.low), float(self.high), log=self.log)

    def contains(self, value) -> bool:
        """Whether a value lies in the space (a bracket trial may lie beyond a range's end)."""
        if self.categorical:
            return str(value) in self.choices
        return self.low <= value <= self.high

    def scale(self, value) -> float:
        """A value on the range's own scale: log10 for a log range."""
        return math.log10(value) if self.log else float(value)

    def unscale(self, x: float):
        value = 10 ** x if self.log else x
        return int(round(value)) if self.integer else value

    def bracket_step(self) -> float:
        """How far beyond a best value the bracket puts a trial, on the range's scale: a fifth of the range (a
        factor 2 for lr over 5e-4..1.6e-2), an integer range's at least 1."""
        step = (self.scale(self.high) - self.scale(self.low)) / 5
        return max(step, 1.0) if self.integer and not self.log else step

    def override(self, value) -> str:
        """The override that sets this value: floats by repr, which reads back to the same float."""
        return f"{self.key}={value if self.categorical or self.integer else repr(float(value))}"

    def ends(self) -> list[str]:
        """Overrides at the space's corners, which the plan composes and validates before anything runs."""
        return [self.override(v) for v in (self.choices or (self.low, self.high))]

    def spec(self) -> str:
        if self.categorical:
            return f"{self.key}=choice({', '.join(self.choices)})"
        kind = f"int(interval({self.low}, {self.high}))" if self.integer else f"interval({self.low}, {self.high})"
        return f"{self.key}={'tag(log, ' + kind + ')' if self.log else kind}"

    def grid_step(self) -> float:
        """A tenth of the range (of log10 for a log scale): how near a best value may sit to an end before
        it is flagged as at the edge."""
        if self.categorical:
            return 0.0
        low, high = (math.log10(self.low), math.log10(self.high)) if self.log else (self.low, self.high)
        return (high - low) / 10


def numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def dimension(override) -> Dimension | None:
    """The searched dimension of one parsed override, or None for a plain value or list (a row axis); a
    range that cannot be searched is a one-line ValueError."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep
    if not override.is_sweep_override():
        return None
    key, sweep = override.get_key_element(), override.value()
    if isinstance(sweep, ChoiceSweep):
        if sweep.simple_form:
            return None
        choices = tuple(override.sweep_string_iterator())
        if len(choices) < 2:
            raise ValueError(f"{key}={override.input_line.split('=', 1)[1]}: choice(...) needs two values or more")
        return Dimension(key, choices=choices)
    if not isinstance(sweep, IntervalSweep):
        return None                         # range(...): a list of rows
    text = override.input_line.split("=", 1)[1] if override.input_line else f"interval({sweep.start}, {sweep.end})"
    log = "log" in sweep.tags
    unknown = set(sweep.tags) - {"log"}
    if unknown:
        raise ValueError(f"{key}={text}: unknown tag {', '.join(sorted(unknown))}; allowed: log")
    if not sweep.start < sweep.end:
        raise ValueError(f"{key}={text}: an empty or reversed range; interval(low, high) needs low < high")
    if log and sweep.start <= 0:
        raise ValueError(f"{key}={text}: a log scale needs low > 0")
    integer = isinstance(sweep.start, int) and isinstance(sweep.end, int)
    return Dimension(key, sweep.start, sweep.end, log=log, integer=integer)


def split(overrides) -> tuple[list, list[Dimension]]:
    """(the overrides that make the rows, the searched dimensions); one key searched twice is refused, and so
    is a list of seeds beside a search: each seed would be a row of its own, searched again."""
    rows, space = [], []
    for override in overrides:
        found = dimension(override)
        if found is None:
            rows.append(override)
        elif any(d.key == found.key for d in space):
            raise ValueError(f"{shown(found.spec())}: {found.key} searched twice; give one range per key")
        else:
            space.append(found)
    seeds = next((o for o in rows if _key(o) == "seed" and o.is_sweep_override()), None)
    unsearched = next((o for o in rows if _key(o).startswith("tune.") and _key(o) not in PLAIN_TUNE_KEYS), None)
    if not space and unsearched is not None:
        raise ValueError(unsearched_line(_key(unsearched), unsearched.get_value_string()))
    if space and seeds is not None:
        raise ValueError(f"seed={seeds.get_value_string()}: a seed list beside a searched key would search "
                         f"each seed again; a search reruns its best values at tune.seeds seeds (e.g. tune.seeds=3)")
    return rows, space


# What a sweep that searches nothing reads of tune.*: detect='s cap on a row's seeds (ddl.launch.power).
PLAIN_TUNE_KEYS = ("tune.max_seeds",)


def unsearched_line(key: str, value: str) -> str:
    """The refusal of a search's setting where no key is searched (it would train plain runs and ignore it)."""
    return (f"{key}={value}: nothing is searched, so a plain run would ignore it; search a key "
            f"(e.g. train.lr=tag(log, interval(3e-4, 3e-2))) or drop {key}")


def _key(override) -> str:
    """An override's key without its + / ++ / ~ (`+variant=x` and `variant=x` name one key)."""
    return override.get_key_element().lstrip("~+")


def split_sweep_params(params: dict, given) -> tuple[dict, list[str]]:
    """A named sweep's `hydra.sweeper.params` less the keys the command line gives (parsed overrides), as
    Hydra's own sweepers let the command line win: (the params kept, the keys replaced)."""
    keys = {_key(o) for o in given}
    kept = {k: v for k, v in params.items() if k.lstrip("~+") not in keys}
    return kept, [k for k in params if k not in kept]
