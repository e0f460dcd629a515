"""`python -m ddl.train key=value ...`: one run without the orchestrator (no Hydra, no MLflow).

    python -m ddl.train model.size=tiny model.residual=ddl model.dv=4 train.steps=300

Keys: model.size (micro|tiny|mini|small|medium|large) and any ModelConfig field as model.<field>,
data.<field>, train.<field>, seed. Runs into DDL_HOME/runs/<signature>/ and prints the final
validation loss beside the corpus' unigram cross-entropy (what a model that learned nothing
beyond token frequencies would score).
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from .. import paths
from ..text import plural
from ..data import DataConfig
from ..model import model_config
from .config import RunConfig, TrainConfig

GROUPS = ("model", "data", "train")


def main(argv: list[str]) -> int:
    from .loggers import ConsoleLogger, JsonlLogger, MultiLogger
    from .loop import train

    try:
        args = OmegaConf.to_container(OmegaConf.from_dotlist(argv))
        for key, value in args.items():
            if key not in GROUPS + ("seed",):
                raise ValueError(f"{key}={value}: unknown key; the keys are {', '.join(GROUPS)}.<field> and seed")
            if key in GROUPS and not isinstance(value, dict):
                raise ValueError(f"{key}={value}: set its fields, as {key}.<field>=<value>")
        model_args, data = dict(args.get("model", {})), DataConfig(**args.get("data", {}))
        model = model_config(model_args.pop("size", "tiny"), vocab_size=data.model_vocab_size(), **model_args)
        run = RunConfig(model, data, TrainConfig(**args.get("train", {})), args.get("seed", 0))
    except (ValueError, TypeError) as err:
        print(f"python -m ddl.train: error: {err}")
        return 2
    signature = run.signature()
    run_dir = paths.runs_dir() / signature
    run_dir.mkdir(parents=True, exist_ok=True)
    logger = MultiLogger(ConsoleLogger(), JsonlLogger(run_dir / "metrics.jsonl"))
    result = train(run, run_dir, logger, signature)
    logger.close()
    print(f"run {signature}: val/loss {result.final['val/loss']:.4f} nats/token "
          f"(unigram cross-entropy {result.extra['unigram_xent_val']:.4f}), val/bpb {result.final['val/bpb']:.4f}, "
          f"{plural(result.steps, 'step')} in {result.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
