"""The A/A test of the whole tuned workflow: synthetic experiments of two rows searched independently by the
project's own decisions (ddl.tune.workflow: TPE with its startup rule, the median pruner with its rule for the
best's neighbours, the bracket, the confirmation's looks), each trial's loss drawn from a model of a row's loss
against its learning rate. Identical rows give the false-positive rate of the verdict; a row better by a true gap
gives its power.

    python -m ddl.tune.simulate                     # 1,000 experiments a cell; prints the table, writes it into
                                                    # docs/results.md between its markers
    python -m ddl.tune.simulate --experiments 50 --no-write

The model, per row: final validation loss L(x) = L0 + curvature (x - x*)^2 at x = log10(lr), x* drawn per
experiment in the middle of the searched range (the same for both rows), plus one draw of seed noise per run
(normal, or Student-t with 3 degrees of freedom scaled to the same sd). A run's validation curve lies above its
final loss by `lag` (1 - t) (lr* / lr)^(1/2) at the fraction t of its steps: a low learning rate starts slow,
which is what a median pruner judging early losses gets wrong. A row better by a gap has every loss lower by
gap L0; TPE, the pruner and the bracket read a search's losses only against each other, so the same draws give
the A/A and the power experiment the same searches, and both seed plans the same confirmation seeds.
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

from .config import TuneConfig
from .search import should_prune
from .sequential import look
from .space import Dimension
from .workflow import next_round, verdict

SPACE = [Dimension("train.lr", 5e-4, 1.6e-2, log=True)]    # sweeps/tuned.yaml's range
CURVATURES = (0.0, 0.04, 0.08, 0.16)                       # nats per decade^2 (0.08: the transfer table's)
NOISES = ("normal", "t3")
SEED_RULES = ("3", "auto")
GAP = 0.05                                                  # the true gap the power column is for
BEGIN, END = "<!-- ddl.tune.simulate: begin -->", "<!-- ddl.tune.simulate: end -->"
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results.md"


@dataclass(frozen=True)
class World:
    curvature: float
    noise: str
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
    whatever the seed plan or the gap)."""

    def __init__(self, world: World, seed: int):
        import numpy as np
        self.world, self.rng = world, np.random.default_rng(seed)
        low, high = (math.log10(d) for d in (SPACE[0].low, SPACE[0].high))
        self.optimum = self.rng.uniform(low + 0.2 * (high - low), high - 0.2 * (high - low))

    def noise(self) -> float:
        if self.world.noise == "t3":
            return float(self.rng.standard_t(3) * self.world.sd / math.sqrt(3))
        return float(self.rng.normal(0, self.world.sd))

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
        batch = [SimTrial(len(trials) + i, values, noise=draws.noise()) for i, values in enumerate(step.new)]
        trials += batch
        for trial in batch:
            _train(trial, draws, trials, cfg, cfg.pruner == "median")
        for trial in step.finish:                  # the bracket: finished with the pruner off
            trial.curve = {}
            _train(trial, draws, trials, cfg, False)
    complete = [t for t in trials if t.state == "complete"]
    best = min(complete, key=lambda t: t.value) if complete else None
    return (best.values["train.lr"] if best else None), not step.open and best is not None, len(trials)


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
            seeds[r] = {s: draws.loss(lr) + draws.noise() for s in cfg.confirm_seeds(0, r, cfg.max_seeds)}
    return Row(bracketed, seeds, trained)


def experiment(world: World, cfg: TuneConfig, seed: int) -> dict:
    """Two rows searched independently; per seed rule, the verdict between them as they are (A/A) and with the
    second better by GAP (power), and the seeds each rule ran a replicate."""
    draws = Draws(world, seed)
    a, b = row(draws, cfg), row(draws, cfg)
    shifted = {r: {s: v - GAP * world.loss for s, v in seeds.items()} for r, seeds in b.seeds.items()}
    bracketed = a.bracketed and b.bracketed
    out = {"bracketed": bracketed, "trials": (a.trials + b.trials) / (2 * cfg.replicates)}
    for rule in SEED_RULES:
        plan = replace(cfg, seeds=rule).seed_plan
        for name, arm in (("aa", b.seeds), ("power", shifted)):
            found = None
            for n in plan:                         # the looks the driver takes, up to the one that ends it
                upto = {r: {s: v for s, v in sorted(seeds.items())[:n]} for r, seeds in arm.items()}
                base = {r: {s: v for s, v in sorted(seeds.items())[:n]} for r, seeds in a.seeds.items()}
                found = look(upto, base, plan, cfg.alpha)
                if found.done:
                    break
            said = verdict(found, bracketed)
            out[rule, name] = said == "better" if name == "power" else said in ("better", "worse")
            out[rule, name, "seeds"] = found.n if found else 0
    return out


@dataclass
class Cell:
    world: World
    rule: str
    experiments: int
    false_positive: float
    power: float
    bracketed: float
    seeds: float
    trials: float

    @property
    def mcse(self) -> float:
        """The Monte Carlo standard error of a rate of alpha over these experiments."""
        return math.sqrt(0.05 * 0.95 / self.experiments)


def run_world(world: World, cfg: TuneConfig, experiments: int, seed: int = 0) -> list[Cell]:
    results = [experiment(world, cfg, seed * 1_000_003 + i) for i in range(experiments)]

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values)
    return [Cell(world, rule, experiments, mean(r[rule, "aa"] for r in results),
                 mean(r[rule, "power"] for r in results), mean(r["bracketed"] for r in results),
                 mean(r[rule, "aa", "seeds"] for r in results), mean(r["trials"] for r in results))
            for rule in SEED_RULES]


def grid(cfg: TuneConfig, experiments: int, jobs: int = 1) -> list[Cell]:
    worlds = [World(c, n) for c in CURVATURES for n in NOISES]
    with ProcessPoolExecutor(jobs) as pool:
        found = pool.map(run_world, worlds, [cfg] * len(worlds), [experiments] * len(worlds),
                         range(len(worlds)))
        return [cell for cells in found for cell in cells]


def table(cells: list[Cell], cfg: TuneConfig) -> str:
    bound = cfg.alpha + 3 * cells[0].mcse
    lines = ["| curvature (nats/decade²) | noise | seeds | false positives (A/A) | ≤ alpha + 3 MCSE | "
             "power, true 5% gap | bracketed | seeds a replicate | trials a search |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c.world.curvature:g} | {'normal' if c.world.noise == 'normal' else 'Student-t(3)'} | "
                     f"{c.rule} | {100 * c.false_positive:.1f}% | {'yes' if c.false_positive <= bound else 'NO'} | "
                     f"{100 * c.power:.1f}% | {100 * c.bracketed:.1f}% | {c.seeds:.2f} | {c.trials:.2f} |")
    return "\n".join(lines)


def settings(cfg: TuneConfig) -> str:
    return (f"tune.trials={cfg.trials}, tune.replicates={cfg.replicates}, tune.parallel={cfg.parallel or 2}, "
            f"tune.pruner={cfg.pruner} (warmup {cfg.prune_warmup}), tune.bracket_trials={cfg.bracket_trials}, "
            f"tune.max_seeds={cfg.max_seeds}, alpha {cfg.alpha}; train.lr over "
            f"{SPACE[0].spec().split('=', 1)[1]}")


def write(path: Path, block: str) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"--write={path}: has no {BEGIN} ... {END} markers to write the table between")
    head, rest = text.split(BEGIN, 1)
    from ..paths import write_atomic
    write_atomic(path, f"{head}{BEGIN}\n{block}\n{END}{rest.split(END, 1)[1]}")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return f"{cpu}, {os.cpu_count()} CPUs"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddl.tune.simulate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", type=int, default=1000, help="experiments a cell (default 1000)")
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--write", type=Path, default=RESULTS, help=f"the file to write into (default {RESULTS})")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--trials", type=int, default=6, help="tune.trials (default 6, sweeps/tuned.yaml's)")
    parser.add_argument("--replicates", type=int, default=TuneConfig.replicates, help="tune.replicates")
    args = parser.parse_args(argv)
    try:
        if args.experiments < 1 or args.jobs < 1:
            raise ValueError(f"--experiments={args.experiments} --jobs={args.jobs}: must be integers >= 1")
        cfg = TuneConfig(trials=args.trials, replicates=args.replicates)
        if not args.no_write and not args.write.is_file():
            raise ValueError(f"--write={args.write}: no such file")
    except ValueError as err:
        print(f"python -m ddl.tune.simulate: error: {err}", file=sys.stderr)
        return 2
    load, started = os.getloadavg()[0], time.monotonic()
    cells = grid(cfg, args.experiments, args.jobs)
    block = (f"{table(cells, cfg)}\n\n`python -m ddl.tune.simulate --experiments {args.experiments}` on "
             f"{date.today().isoformat()}, {machine()}, {args.jobs} process(es), load average {load:.1f} at the "
             f"start: {time.monotonic() - started:.0f} s. Settings: {settings(cfg)}. The bound: alpha + 3 Monte "
             f"Carlo standard errors of a rate of alpha over {args.experiments} experiments.")
    print(block)
    if not args.no_write:
        try:
            write(args.write, block)
        except ValueError as err:
            print(f"python -m ddl.tune.simulate: error: {err}", file=sys.stderr)
            return 2
        print(f"written into {args.write}")
    return 0 if all(c.false_positive <= cfg.alpha + 3 * c.mcse for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
