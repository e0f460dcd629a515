"""A sweep's search settings (`tune.*`), checked before anything runs. Pure Python: no optuna here.

The user sets `trials`, `seeds`, `max_seeds`, `parallel`, `pruner`, `prune_warmup`, `sampler_seed`, `alpha`,
`search_size`, `horizon_exponent`, `max_horizon_ratio` (ddl/tune/horizon.py);
the search driver sets `keys`, `search`, `trial`, `parent` and `role` on the jobs it launches, which is how a job
knows it is a trial (its MLflow tags, its pruning). None of it enters a run's signature.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import failure, is_finite, is_int, is_number

_fail = failure("tune")
ROLES = ("", "trial", "confirm")
PRUNERS = ("median", "none")


@dataclass(frozen=True)
class TuneConfig:
    trials: int = 8                 # trials per row's search
    seeds: str = "3"                # seeds of the confirmation: an integer >= 1, or auto (add until resolved)
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
        if self.seeds != "auto" and not (self.seeds.isdigit() and int(self.seeds) >= 1):
            _fail("seeds", self.seeds, "must be an integer >= 1 or auto")
        if not is_int(self.max_seeds) or self.max_seeds < 3:
            _fail("max_seeds", self.max_seeds, "must be an integer >= 3")
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

    @property
    def seed_plan(self) -> tuple[int, ...]:
        """The seed counts at which the confirmation looks: one look at `seeds`, or auto's 3, 5, ... up to
        max_seeds (its last look at max_seeds)."""
        if self.seeds != "auto":
            return (int(self.seeds),)
        looks = list(range(3, self.max_seeds, 2))
        return (*looks, self.max_seeds)
