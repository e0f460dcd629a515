"""A sweep's search settings (`tune.*`), checked before anything runs. Pure Python: no optuna here.

The user sets `trials`, `replicates`, `bracket_trials`, `seeds`, `max_seeds`, `parallel`, `pruner`,
`prune_warmup`, `sampler_seed`, `alpha`, `search_size`, `horizon_exponent`, `max_horizon_ratio` (ddl/tune/horizon.py);
the search driver sets `keys`, `search`, `trial`, `parent` and `role` on the jobs it launches, which is how a job
knows it is a trial (its MLflow tags, its pruning). None of it enters a run's signature.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import failure, is_finite, is_int, is_number

_fail = failure("tune")
ROLES = ("", "trial", "confirm")
PRUNERS = ("median", "none")
# Replicate r of a row's search draws its trials at the row's seed + STRIDE r and its confirmation at the seeds
# after that one, and seeds TPE with sampler_seed + STRIDE r: replicates never share a seed or a draw, and
# replicate 0 is the search as it was before replicates (its id, seeds and draws).
REPLICATE_STRIDE = 1000


@dataclass(frozen=True)
class TuneConfig:
    trials: int = 8                 # trials per search (each replicate of a row)
    replicates: int = 3             # independent searches per row: the unit of the row's interval and verdict
    bracket_trials: int = 2         # trials a search may add beyond an edge its best is not bracketed on
    seeds: str = "3"                # fresh seeds per replicate at its best: an integer >= 1, or auto (until resolved)
    max_seeds: int = 9              # auto's maximum
    parallel: int | None = None     # trials asked at once per row (null: the launcher's parallel slots)
    pruner: str = "median"          # Optuna's MedianPruner on val/loss at the eval points, or none
    prune_warmup: float = 0.5       # no pruning before this fraction of the trial's steps (a low lr starts slow)
    sampler_seed: int = 0           # TPE's seed: the same history asks the same next trials
    alpha: float = 0.05             # the confirmation's error rate (two-sided), over all its looks
    search_size: str | None = None  # search only the rows of this size; the others run their row's best found there
    horizon_exponent: float | None = None   # a carried lr times (tokens there / here)^-exponent (ddl/tune/horizon.py)
    max_horizon_ratio: float | None = 2.0   # without an exponent, no carry across more than this ratio of tokens
    keys: tuple[str, ...] = ()      # set by the driver on its jobs: the searched keys
    search: str = ""                # ... the row's search id
    trial: int = -1                 # ... the trial's number in it
    parent: str = ""                # ... the search's parent MLflow run
    role: str = ""                  # ... trial | confirm

    def __post_init__(self) -> None:
        object.__setattr__(self, "seeds", str(self.seeds))
        object.__setattr__(self, "keys", tuple(self.keys))
        if not is_int(self.trials) or self.trials < 1:
            _fail("trials", self.trials, "must be an integer >= 1 (trials per row's search)")
        if not is_int(self.replicates) or not 1 <= self.replicates < REPLICATE_STRIDE:
            _fail("replicates", self.replicates, f"must be an integer in [1, {REPLICATE_STRIDE}) (independent "
                                                 f"searches per row; 3 or more give the row an interval)")
        if not is_int(self.bracket_trials) or self.bracket_trials < 0:
            _fail("bracket_trials", self.bracket_trials, "must be an integer >= 0")
        if self.seeds != "auto" and not (self.seeds.isdigit() and 1 <= int(self.seeds) < REPLICATE_STRIDE):
            _fail("seeds", self.seeds, f"must be an integer in [1, {REPLICATE_STRIDE}) or auto")
        if not is_int(self.max_seeds) or not 3 <= self.max_seeds < REPLICATE_STRIDE:
            _fail("max_seeds", self.max_seeds, f"must be an integer in [3, {REPLICATE_STRIDE})")
        if self.parallel is not None and (not is_int(self.parallel) or self.parallel < 1):
            _fail("parallel", self.parallel, "must be null or an integer >= 1")
        if self.pruner not in PRUNERS:
            _fail("pruner", self.pruner, f"must be one of {', '.join(PRUNERS)}")
        if not is_number(self.prune_warmup) or not 0 <= self.prune_warmup < 1:
            _fail("prune_warmup", self.prune_warmup, "must be a number in [0, 1)")
        if not is_number(self.alpha) or not 0 < self.alpha < 1:
            _fail("alpha", self.alpha, "must be a number in (0, 1)")
        if self.search_size is not None and not (isinstance(self.search_size, str) and self.search_size):
            _fail("search_size", self.search_size, "must be null or one of the sweep's sizes")
        if self.horizon_exponent is not None and not is_finite(self.horizon_exponent):
            _fail("horizon_exponent", self.horizon_exponent,
                  "must be null or a finite number (a carried lr times (tokens there / here)^-exponent)")
        ratio = self.max_horizon_ratio
        if ratio is not None and not (is_finite(ratio) and ratio >= 1):
            _fail("max_horizon_ratio", self.max_horizon_ratio, "must be null or a number >= 1 (a ratio of tokens)")
        if self.role not in ROLES:
            _fail("role", self.role, f"must be one of {', '.join(r or repr(r) for r in ROLES)}")

    def selection_seed(self, first: int, replicate: int) -> int:
        """The seed replicate `replicate` of a row whose seed is `first` searches at."""
        return first + REPLICATE_STRIDE * replicate

    def confirm_seeds(self, first: int, replicate: int, n: int) -> range:
        """The replicate's n confirmation seeds: fresh ones, after the seed its trials selected the best at."""
        start = self.selection_seed(first, replicate) + 1
        return range(start, start + n)

    @property
    def seed_plan(self) -> tuple[int, ...]:
        """The seed counts at which the confirmation looks: one look at `seeds`, or auto's 3, 5, ... up to
        max_seeds (its last look at max_seeds)."""
        if self.seeds != "auto":
            return (int(self.seeds),)
        looks = list(range(3, self.max_seeds, 2))
        return (*looks, self.max_seeds)
