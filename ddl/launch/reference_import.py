"""`ddl-eval import-reference`: a checkpoint of the authors' code as a ddl run.

    ddl-eval import-reference <state_dict.pt> --variant ddl_dv4 [--data fineweb_edu|embedded]
                              [--experiment reference] [--max-seq-len 1024]

The weights are mapped onto our GPT (ddl.model.reference), written as a checkpoint under
DDL_HOME/runs/ref-<hash>/ and recorded as a FINISHED MLflow run with the variant's params, so
`ddl-eval ref-<hash> --tasks ...` evaluates it and `make report` shows it (no training curves
and no validation loss: neither is in the file). Everything is checked before anything is written.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from .. import paths
from ..validation import OneLineParser

# What the checkpoint's tokens are: the authors' data and tokenizer, or the embedded corpus' bytes.
DATA = {"fineweb_edu": dict(source="fineweb_edu", tokenizer="gpt2"),
        "embedded": dict(source="embedded", tokenizer="byte")}


def _read_state_dict(path: Path) -> dict:
    import torch
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:   # torch raises many kinds for a file that is not a checkpoint
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"checkpoint={str(path)!r}: not a torch state dict ({type(err).__name__}: {first[:200]})") \
            from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):   # a training checkpoint around it
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"checkpoint={str(path)!r}: not a state dict (a mapping of names to tensors)")
    return state


def import_reference(path: Path, variant: str, data: str, experiment: str, max_seq_len: int) -> tuple[str, str]:
    """(signature, MLflow run id) of the imported checkpoint; ValueError naming what does not fit."""
    from ..data import DataConfig
    from ..model.reference import load_reference
    from ..track import runs
    from ..train import RunConfig, TrainConfig
    from ..train import checkpoint
    from .spec import row_name, run_params

    if not path.is_file():
        raise ValueError(f"checkpoint={str(path)!r}: no such file")
    model = load_reference(_read_state_dict(path), variant, max_seq_len)
    data_cfg = DataConfig(**DATA[data])
    run = RunConfig(model.cfg, data_cfg, TrainConfig(seq_len=min(TrainConfig().seq_len, max_seq_len)))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    signature = "ref-" + hashlib.sha256(f"{digest} {variant} {data} {max_seq_len}".encode()).hexdigest()[:12]
    run_dir = paths.runs_dir() / signature
    checkpoint.save(run_dir, {"model": model.state_dict(), "run": run.to_dict(), "step": 0, "signature": signature,
                              "dataset": str(paths.data_dir() / data_cfg.dataset_name())}, keep=1)
    params = {key: value for key, value in run_params(run).items() if not key.startswith("train.")}  # not trained here
    params["seed"] = "imported"     # one trained model; the report pairs imported runs with each other
    tags = {"ddl.imported_from": str(path.resolve()), "ddl.imported_sha256": digest, "ddl.launcher": "import",
            "ddl.tokenizer": data_cfg.tokenizer, "ddl.loss_unit": f"nats/token ({data_cfg.tokenizer})",
            "ddl.row": row_name(model.cfg), "ddl.sweep": experiment}
    run = runs.open_run(experiment, signature, f"{variant}-reference", params, tags, run_dir)
    runs.close_run(run, "FINISHED")
    return signature, run.id


def main(argv: list[str] | None = None) -> int:
    from ..model.reference import VARIANTS
    from .spec import valid_experiment
    parser = OneLineParser(prog="ddl-eval import-reference", description=__doc__,
                           formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a state dict saved by the authors' code (.pt / .bin)")
    parser.add_argument("--variant", required=True, choices=list(VARIANTS), help="the reference model it was made by")
    parser.add_argument("--data", default="fineweb_edu", choices=list(DATA),
                        help="what its tokens are: fineweb_edu (GPT-2 BPE, the paper's) or embedded (bytes)")
    parser.add_argument("--experiment", default="reference", help="the MLflow experiment to record it in")
    parser.add_argument("--max-seq-len", type=int, default=1024, help="context length (the authors' block_size)")
    args = parser.parse_args(argv)
    try:
        if args.max_seq_len < 1:
            raise ValueError(f"max_seq_len={args.max_seq_len}: must be an integer >= 1")
        valid_experiment(args.experiment)
        signature, run_id = import_reference(args.checkpoint, args.variant, args.data, args.experiment,
                                             args.max_seq_len)
    except ValueError as err:
        print(f"ddl-eval: error: {err}")
        return 2
    print(f"imported {args.checkpoint} as {args.variant}: run {signature} in experiment '{args.experiment}' "
          f"(MLflow run {run_id})\nevaluate it: ddl-eval {signature} --tasks <task ...>")
    return 0
