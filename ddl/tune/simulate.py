"""The A/A test of the whole tuned workflow: synthetic experiments of two rows searched independently by the
project's own decisions (ddl.tune.workflow: TPE with its startup rule, the median pruner with its rule for the
best's neighbours, the bracket, the confirmation's looks), each trial's loss drawn from a model of a row's loss
against its learning rate. Identical rows give the false-positive rate of the verdict; a row better by a true gap
gives its power, at gaps of 0.25-2% of the loss and at the paper's three (d_v=1, d_v=4, EC at small).

    python -m ddl.tune.simulate                     # 1,000 experiments a cell; prints the table, writes it into
                                                    # docs/results.md between its markers
    python -m ddl.tune.simulate --experiments 50 --no-write
    python -m ddl.tune.simulate --designs           # replicates x seeds compared at one world (power per run)

The model, per row: final validation loss L(x) = L0 + curvature (x - x*)^2 at x = log10(lr), x* drawn per
experiment in the middle of the searched range (the same for both rows), plus one draw of seed noise per run
(normal, or Student-t with 3 degrees of freedom scaled to the same sd). A run's validation curve lies above its
final loss by `lag` (1 - t) (lr* / lr)^(1/2) at the fraction t of its steps: a low learning rate starts slow,
which is what a median pruner judging early losses gets wrong. A row better by a gap has every loss lower by
gap L0; TPE, the pruner and the bracket read a search's losses only against each other, so the same draws give
the A/A and every gap's experiment the same searches, and both seed plans the same confirmation seeds. A search's
best and bracket are the driver's (ddl.tune.bracket), its looks and verdict too (ddl.tune.sequential, workflow).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path

from ..stats import detectable
from ..validation import OneLineParser
from .bracket import best, open_edges
from .config import TuneConfig
from .search import should_prune
from .sequential import look, look_levels
from .space import Dimension
from .workflow import next_round, verdict

SPACE = [Dimension("train.lr", 5e-4, 1.6e-2, log=True)]    # sweeps/tuned.yaml's range
CURVATURES = (0.0, 0.04, 0.08, 0.16)                       # nats per decade^2 (0.08: the transfer table's)
NOISES = ("normal", "t3")
SEED_RULES = ("3", "auto")
GAPS = (0.0021, 0.0025, 0.005, 0.0066, 0.0085, 0.01, 0.02)  # true gaps, shares of L0: the paper's at small among them
PAPER_GAPS = {0.0021: "d_v=1", 0.0066: "d_v=4", 0.0085: "EC"}
CORRELATION = 0.0      # the share of a seed's noise two rows share at one seed: about 0 measured (docs/results.md)
DESIGNS = ((3, "3"), (3, "auto"), (4, "2"), (6, "1"), (5, "3"), (8, "2"))   # (replicates, seeds) --designs compares
BEGIN, END = "<!-- ddl.tune.simulate: begin -->", "<!-- ddl.tune.simulate: end -->"
DESIGNS_BEGIN, DESIGNS_END = "<!-- ddl.tune.simulate --designs: begin -->", "<!-- ddl.tune.simulate --designs: end -->"
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results.md"


@dataclass(frozen=True)
class World:
    curvature: float
    noise: str
    correlation: float = CORRELATION
    sd: float = 0.015              # a seed's sd: the tuned study's spread
    loss: float = 1.87             # L0, the optimum's loss (the tuned study's baseline)
    lag: float = 0.3               # how far a run's early validation loss lies above its final one
    steps: int = 600
    every: int = 100               # validations: the pruner's points


@dataclass
class SimTrial:
    """A simulated run, with the fields the workflow reads of a stored one (ddl.track.searches.Trial)."""
    number: int
    values: dict
    state: str = "running"
    value: float | None = None
    curve: dict = field(default_factory=dict)
    role: str = "trial"
    noise: float = 0.0             # its seed's draw


class Draws:
    """One experiment's random numbers: its optimum, and a noise draw per run (the same draw for the same run
    whatever the seed plan or the gap), whose shared part is one draw per seed (`key`)."""

    def __init__(self, world: World, seed: int):
        import numpy as np
        self.world, self.rng = world, np.random.default_rng(seed)
        low, high = (math.log10(d) for d in (SPACE[0].low, SPACE[0].high))
        self.optimum = self.rng.uniform(low + 0.2 * (high - low), high - 0.2 * (high - low))
        self.shared: dict = {}

    def _draw(self) -> float:
        """A standard draw: normal, or Student-t(3) scaled to unit variance."""
        if self.world.noise == "t3":
            return float(self.rng.standard_t(3) / math.sqrt(3))
        return float(self.rng.normal())

    def noise(self, key) -> float:
        """A run's noise at the seed `key`: the seed's shared draw and the run's own, in their shares."""
        shared = self.shared.setdefault(key, self._draw())
        rho = self.world.correlation
        return self.world.sd * (math.sqrt(rho) * shared + math.sqrt(1 - rho) * self._draw())

    def loss(self, lr: float) -> float:
        return self.world.loss + self.world.curvature * (math.log10(lr) - self.optimum) ** 2


def _train(trial: SimTrial, draws: Draws, trials: list[SimTrial], cfg: TuneConfig, pruner: bool) -> None:
    """A trial trained to its end, or pruned at a validation, as ddl.launch.job's pruner does."""
    world, lr = draws.world, trial.values["train.lr"]
    final = draws.loss(lr) + trial.noise
    peers = [t for t in trials if t is not trial]
    for step in range(world.every, world.steps + 1, world.every):
        lag = world.lag * (1 - step / world.steps) * math.sqrt(10 ** draws.optimum / lr)
        trial.curve[step] = final + lag
        if pruner and step < world.steps and should_prune(peers, trial.curve, world.steps, cfg, trial.values):
            trial.state, trial.value = "pruned", trial.curve[step]
            return
    trial.state, trial.value = "complete", final


def search(draws: Draws, cfg: TuneConfig, replicate: int) -> tuple[float | None, bool, int]:
    """One replicate's search, round by round as the driver runs it: (the best lr, whether it is bracketed, the
    trials it trained)."""
    trials: list[SimTrial] = []
    parallel = cfg.parallel or 2
    while True:
        step = next_round(trials, SPACE, cfg, replicate, parallel)
        if step.done:
            break
        batch = [SimTrial(len(trials) + i, values, noise=draws.noise(("selection", replicate)))
                 for i, values in enumerate(step.new)]
        trials += batch
        for trial in batch:
            _train(trial, draws, trials, cfg, cfg.pruner == "median")
        for trial in step.finish:                  # the bracket: finished with the pruner off
            trial.curve = {}
            _train(trial, draws, trials, cfg, False)
    found = best(trials)                          # as the driver reads the search when it ends
    return (found.values["train.lr"] if found else None), found is not None and not open_edges(trials, SPACE), \
        len(trials)


@dataclass
class Row:
    """A row's replicates: bracketed or not, and each one's confirmation seeds {seed: loss} up to max_seeds."""
    bracketed: bool
    seeds: dict
    trials: int


def row(draws: Draws, cfg: TuneConfig) -> Row:
    bracketed, seeds, trained = True, {}, 0
    for r in range(cfg.replicates):
        lr, ok, n = search(draws, cfg, r)
        bracketed &= ok
        trained += n
        if lr is not None:
            seeds[r] = {s: draws.loss(lr) + draws.noise((r, s)) for s in cfg.confirm_seeds(0, r, cfg.max_seeds)}
    return Row(bracketed, seeds, trained)


def experiment(world: World, cfg: TuneConfig, seed: int, rules=SEED_RULES) -> dict:
    """Two rows searched independently; per seed rule, the verdict between them as they are (A/A) and with the
    second better by each of GAPS (power), the seeds each rule ran a replicate, and the variance of the replicates'
    differences at the last look (the search's luck with the seeds' noise)."""
    draws = Draws(world, seed)
    a, b = row(draws, cfg), row(draws, cfg)
    bracketed = a.bracketed and b.bracketed
    out = {"bracketed": bracketed, "trials": (a.trials + b.trials) / (2 * cfg.replicates)}
    for rule in rules:
        plan = replace(cfg, seeds=rule).seed_plan
        for gap in (0.0, *GAPS):
            arm = {r: {s: v - gap * world.loss for s, v in seeds.items()} for r, seeds in b.seeds.items()}
            found = _confirm(arm, a.seeds, plan, cfg.alpha)
            said = verdict(found, bracketed)
            out[rule, gap] = said in ("better", "worse") if gap == 0 else said == "better"
            if gap == 0:
                d = found.difference if found else None
                out[rule, "seeds"] = found.n if found else 0
                out[rule, "variance"] = d.std ** 2 if d is not None and d.std is not None else None
    return out


def _confirm(arm: dict, base: dict, plan: tuple[int, ...], alpha: float):
    """The looks the driver takes, up to the one that ends it."""
    found = None
    for n in plan:
        upto = {r: dict(sorted(seeds.items())[:n]) for r, seeds in arm.items()}
        reference = {r: dict(sorted(seeds.items())[:n]) for r, seeds in base.items()}
        found = look(upto, reference, plan, alpha)
        if found.done:
            break
    return found


@dataclass
class Cell:
    world: World
    rule: str
    experiments: int
    false_positive: float
    power: dict                    # gap -> the share of experiments whose verdict was "better"
    bracketed: float
    seeds: float
    trials: float
    alpha: float
    detectable: float | None       # the gap (a share of L0) resolved with 80% power from the seeds' noise alone
    measured: float | None         # ... from the replicates' differences the experiments measured (with the luck)
    replicates: int = 3

    @property
    def mcse(self) -> float:
        """The Monte Carlo standard error of a rate of alpha over these experiments."""
        return math.sqrt(self.alpha * (1 - self.alpha) / self.experiments)

    @property
    def runs(self) -> float:
        """Runs a row: its replicates' trials and confirmation seeds."""
        return self.replicates * (self.trials + self.seeds)


def run_world(world: World, cfg: TuneConfig, experiments: int, seed: int = 0, rules=SEED_RULES) -> list[Cell]:
    results = [experiment(world, cfg, seed * 1_000_003 + i, rules) for i in range(experiments)]

    def mean(values) -> float | None:
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None
    cells = []
    for rule in rules:
        plan = replace(cfg, seeds=rule).seed_plan
        level = look_levels(plan, cfg.alpha)[-1]
        unit_sd = world.sd * math.sqrt(2 * (1 - world.correlation) / plan[-1])
        theory = detectable(unit_sd, cfg.replicates, level)
        variance = mean(r[rule, "variance"] for r in results)
        measured = detectable(math.sqrt(variance), cfg.replicates, level) if variance is not None else None
        cells.append(Cell(world, rule, experiments, mean(r[rule, 0.0] for r in results),
                          {g: mean(r[rule, g] for r in results) for g in GAPS}, mean(r["bracketed"] for r in results),
                          mean(r[rule, "seeds"] for r in results), mean(r["trials"] for r in results), cfg.alpha,
                          theory and theory / world.loss, measured and measured / world.loss, cfg.replicates))
    return cells


def grid(cfg: TuneConfig, experiments: int, jobs: int = 1, correlation: float = CORRELATION) -> list[Cell]:
    worlds = [World(c, n, correlation) for c in CURVATURES for n in NOISES]
    with ProcessPoolExecutor(jobs) as pool:
        found = pool.map(run_world, worlds, [cfg] * len(worlds), [experiments] * len(worlds),
                         range(len(worlds)))
        return [cell for cells in found for cell in cells]


def _percent(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:.2g}%"


def _gap_header(gap: float) -> str:
    return f"{100 * gap:.2g}%" + (f" ({PAPER_GAPS[gap]})" if gap in PAPER_GAPS else "")


def table(cells: list[Cell], cfg: TuneConfig) -> str:
    bound = cfg.alpha + 3 * cells[0].mcse
    lines = ["| curvature (nats/decade²) | noise | seeds | false positives (A/A) | ≤ alpha + 3 MCSE | "
             + " | ".join(f"power at {_gap_header(g)}" for g in GAPS)
             + " | detectable gap: seed noise / measured | bracketed | seeds a replicate | trials a search |",
             "|---|---|---|---|---|" + "---|" * len(GAPS) + "---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c.world.curvature:g} | {'normal' if c.world.noise == 'normal' else 'Student-t(3)'} | "
                     f"{c.rule} | {100 * c.false_positive:.1f}% | {'yes' if c.false_positive <= bound else 'NO'} | "
                     + " | ".join(f"{100 * c.power[g]:.1f}%" for g in GAPS)
                     + f" | {_percent(c.detectable)} / {_percent(c.measured)} | {100 * c.bracketed:.1f}% | "
                     f"{c.seeds:.2f} | {c.trials:.2f} |")
    return "\n".join(lines)


def designs(cfg: TuneConfig, experiments: int, jobs: int = 1, correlation: float = CORRELATION) -> list[Cell]:
    """DESIGNS at the middle world (curvature 0.08, normal noise): each (replicates, seeds) a cell."""
    configs = [replace(cfg, replicates=r) for r, _ in DESIGNS]
    with ProcessPoolExecutor(jobs) as pool:
        found = pool.map(run_world, [World(0.08, "normal", correlation)] * len(DESIGNS), configs,
                         [experiments] * len(DESIGNS),
                         range(len(DESIGNS)), [(rule,) for _, rule in DESIGNS])
        return [cell for cells in found for cell in cells]


def design_table(cells: list[Cell]) -> str:
    lines = ["| replicates x seeds | runs a row | false positives (A/A) | "
             + " | ".join(f"power at {_gap_header(g)}" for g in GAPS)
             + " | detectable gap: seed noise / measured |", "|---|---|---|" + "---|" * len(GAPS) + "---|"]
    for c in cells:
        lines.append(f"| {c.replicates} x {c.rule} | {c.runs:.1f} | {100 * c.false_positive:.1f}% | "
                     + " | ".join(f"{100 * c.power[g]:.1f}%" for g in GAPS)
                     + f" | {_percent(c.detectable)} / {_percent(c.measured)} |")
    return "\n".join(lines)


def settings(cfg: TuneConfig, designs: bool = False) -> str:
    replicates = "replicates and seeds as in each row" if designs else f"tune.replicates={cfg.replicates}"
    return (f"tune.trials={cfg.trials}, {replicates}, tune.parallel={cfg.parallel or 2}, "
            f"tune.pruner={cfg.pruner} (warmup {cfg.prune_warmup}), tune.bracket_trials={cfg.bracket_trials}, "
            f"tune.max_seeds={cfg.max_seeds}, alpha {cfg.alpha}; train.lr over "
            f"{SPACE[0].spec().split('=', 1)[1]}")


def write(path: Path, block: str, begin: str = BEGIN, end: str = END) -> None:
    text = path.read_text()
    if begin not in text or end not in text:
        raise ValueError(f"--write={path}: has no {begin} ... {end} markers to write the table between")
    head, rest = text.split(begin, 1)
    from ..paths import write_atomic
    write_atomic(path, f"{head}{begin}\n{block}\n{end}{rest.split(end, 1)[1]}")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return f"{cpu}, {os.cpu_count()} CPUs"


def _arguments(argv) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m ddl.tune.simulate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=1000, help="experiments a cell (default 1000)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--write", type=Path, default=RESULTS, help=f"the file to write into (default {RESULTS})")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--trials", type=int, default=6, help="tune.trials (default 6, sweeps/tuned.yaml's)")
    parser.add_argument("--replicates", type=int, default=TuneConfig.replicates, help="tune.replicates")
    parser.add_argument("--designs", action="store_true", help=f"compare replicates x seeds {DESIGNS} instead")
    parser.add_argument("--correlation", type=float, default=CORRELATION,
                        help=f"the share of a seed's noise two rows share at one seed (default {CORRELATION})")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = _arguments(argv)
    try:
        if args.experiments < 1 or args.jobs < 1:
            raise ValueError(f"--experiments={args.experiments} --jobs={args.jobs}: must be integers >= 1")
        if not 0 <= args.correlation < 1:
            raise ValueError(f"--correlation={args.correlation}: must be a share in [0, 1)")
        cfg = TuneConfig(trials=args.trials, replicates=args.replicates)
        if not args.no_write and not args.write.is_file():
            raise ValueError(f"--write={args.write}: no such file")
    except ValueError as err:
        print(f"python -m ddl.tune.simulate: error: {err}", file=sys.stderr)
        return 2
    started = time.monotonic()
    cells = designs(cfg, args.experiments, args.jobs, args.correlation) if args.designs else \
        grid(cfg, args.experiments, args.jobs, args.correlation)
    shown = design_table(cells) if args.designs else table(cells, cfg)
    from ..paths import git_state
    commit, dirty = git_state()
    block = (f"{shown}\n\n`python -m ddl.tune.simulate --experiments {args.experiments}"
             f"{' --designs' if args.designs else ''}` on {date.today().isoformat()} at {commit[:7]}"
             f"{' (uncommitted changes)' if dirty == 'true' else ''}, {machine()}: {time.monotonic() - started:.0f} s. "
             f"Settings: {settings(cfg, args.designs)}; seed noise sd {World.sd}, a share "
             f"{args.correlation:g} of it shared by two rows at one seed. The bound: alpha + 3 Monte Carlo "
             f"standard errors of a rate of alpha over {args.experiments} experiments.")
    print(block)
    if not args.no_write:
        try:
            write(args.write, block, *((DESIGNS_BEGIN, DESIGNS_END) if args.designs else (BEGIN, END)))
        except ValueError as err:
            print(f"python -m ddl.tune.simulate: error: {err}", file=sys.stderr)
            return 2
        print(f"written into {args.write}")
    return 0 if all(c.false_positive <= cfg.alpha + 3 * c.mcse for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
