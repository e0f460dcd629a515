"""`python -m ddl.coord`: µP's coordinate check (Yang et al. 2022, Tensor Programs V).

Trains each row (baseline, DDL d_v=1, d_v=4) for a few AdamW steps at several widths, the depth and
the head size fixed (the micro size's 2 layers, heads of 32), under model.param=sp and mup (base width
64), on the same batches of the embedded corpus (byte tokens), at an lr large enough for sp's blow-up
to show. At every step (step 0: the initial model, before any update) it records the mean absolute
value of the activations: the embedding output, each block's output (for DDL the state X), the
state's final readout (d_v > 1), each Delta sublayer's beta gate pre-activation (its logit), the
logits. Under µP the curves are flat in width once training has moved the weights (at step 0 the
logits and the gate, µP's readouts, start at O(1/sqrt(width))); under sp the logits and the blocks'
outputs grow with width.

Writes DIR/coord.csv (param, row, width, step, layer, abs_mean; the mean over --seeds initialisations)
and DIR/coord.png (abs_mean against width, one line per step; a panel per layer group, the mean of
its layers, for each row and parameterization), and prints each group's flatness at the last step:
its abs_mean at the widest width over the narrowest.

    python -m ddl.coord [--out DIR] [--widths 64,128,256,512] [--steps 4] [--lr 1e-2] [--seeds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import paths
from .data.sources import embedded_documents
from .data.tokenizers import ByteTokenizer
from .model import GPT, model_config
from .model.mup import optimizer_groups
from .train.config import TrainConfig
from .validation import failure, is_finite

ROWS = {"baseline": dict(residual="baseline"), "ddl_dv1": dict(residual="ddl", dv=1),
        "ddl_dv4": dict(residual="ddl", dv=4)}
PARAMS = ("sp", "mup")
WIDTHS = (64, 128, 256, 512)
HEAD_DIM, BASE_WIDTH = 32, 64
BATCH, SEQ_LEN = 8, 64
# a layer's group (its name up to the first digit or dot) -> the figure's column
GROUPS = {"embedding": "embedding", "block": "block outputs", "readout": "state readout",
          "beta": "beta gate logit", "logits": "logits"}

_fail = failure()


def corpus() -> torch.Tensor:
    """The embedded corpus as byte tokens, documents separated by the tokenizer's eot."""
    text = chr(ByteTokenizer.eot).join(embedded_documents()).encode("utf-8")
    return torch.from_numpy(np.frombuffer(text, dtype=np.uint8).astype(np.int64))


def fixed_batches(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n (x, y) batches of random windows of the corpus: the same for every width, row and param."""
    tokens = corpus()
    starts = torch.randint(0, len(tokens) - SEQ_LEN - 1, (n, BATCH), generator=torch.Generator().manual_seed(seed))
    windows = tokens[starts[..., None] + torch.arange(SEQ_LEN + 1)]                # (n, B, T+1)
    return [(w[:, :-1], w[:, 1:]) for w in windows]


def build(row: str, param: str, width: int, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(model_config("micro", head_size=HEAD_DIM, d_model=width, max_seq_len=SEQ_LEN, param=param,
                            mup_base_width=BASE_WIDTH, vocab_size=ByteTokenizer.vocab_size, **ROWS[row]))


def _abs_mean(t: torch.Tensor) -> float:
    return t.detach().abs().mean().item()


@contextlib.contextmanager
def recording(model: GPT):
    """Forward hooks that put each layer's abs mean in the latest forward into the yielded dict: the embedding, each
    block's state, the final readout (the last block's read of its state, d_v > 1) and each Delta sublayer's gate
    logit (from the betas it recorded)."""
    seen: dict[str, float] = {}

    def block(i: int):
        def hook(module, args, out):
            seen[f"block{i}"] = _abs_mean(out[0])
            if i == len(model.blocks) - 1 and out[1] is not None:
                seen["readout"] = _abs_mean(out[1])
        return hook

    def gates(module, args, out):
        for name, delta in model.delta_residuals():
            seen[f"beta.{name}"] = _abs_mean(torch.logit(delta.last_betas[0] / 2))
        model.kept.clear()

    hooks = [model.wte.register_forward_hook(lambda module, args, out: seen.__setitem__("embedding", _abs_mean(out)))]
    hooks += [b.register_forward_hook(block(i)) for i, b in enumerate(model.blocks)]
    hooks.append(model.register_forward_hook(gates))
    model.kept = []                                  # the last block stores its state too
    try:
        yield seen
    finally:
        model.kept = None
        for hook in hooks:
            hook.remove()


def coordinates(model: GPT, batches: list, lr: float) -> dict[tuple[int, str], float]:
    """{(step, layer): abs mean} of the forward on batches[step], after `step` AdamW updates on the
    batches before it (TrainConfig's betas and weight decay; µP's lr and decay per group)."""
    train = TrainConfig()
    optimizer = torch.optim.AdamW(optimizer_groups(model, model.cfg, lr, train.weight_decay), lr=lr,
                                  betas=(train.beta1, train.beta2))
    found = {}
    with recording(model) as seen:
        for step, (x, y) in enumerate(batches):
            logits, loss = model(x, y)
            found.update({(step, layer): value for layer, value in seen.items()})
            found[step, "logits"] = _abs_mean(logits)
            if step < len(batches) - 1:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
    return found


def coord_check(widths=WIDTHS, steps: int = 4, lr: float = 1e-2, seeds: int = 2) -> pd.DataFrame:
    """The coordinate check's table: one line per param, row, width, step and layer, the abs mean over seeds."""
    batches = fixed_batches(steps + 1)
    records = []
    for param in PARAMS:
        for row in ROWS:
            for width in widths:
                runs = [coordinates(build(row, param, width, seed), batches, lr) for seed in range(seeds)]
                records += [dict(param=param, row=row, width=width, step=step, layer=layer,
                                 abs_mean=float(np.mean([run[step, layer] for run in runs])))
                            for step, layer in runs[0]]
    return pd.DataFrame(records)


def by_group(table: pd.DataFrame) -> pd.DataFrame:
    """abs_mean averaged over each group's layers (block0, block1 -> block)."""
    group = table["layer"].str.extract(r"^([a-z]+)", expand=False).rename("group")
    return table.groupby(["param", "row", group, "step", "width"], sort=False)["abs_mean"].mean().reset_index()


def flatness(table: pd.DataFrame) -> pd.DataFrame:
    """Per param, row, group and step: abs_mean at the widest width over the narrowest."""
    ends = by_group(table).pivot_table(index=["param", "row", "group", "step"], columns="width", values="abs_mean",
                                       sort=False)
    return (ends[ends.columns.max()] / ends[ends.columns.min()]).rename("ratio").reset_index()


def figure(table: pd.DataFrame):
    """Yang et al.'s figure: abs_mean against width (log-log), one line per step; a column per layer group
    (the mean of its layers), a line of panels per row and param, each column on one y scale."""
    from .report.figures import pyplot
    plt = pyplot()
    groups = by_group(table)
    columns = [g for g in GROUPS if g in set(groups["group"])]
    lines = [(row, param) for row in groups["row"].unique() for param in PARAMS]
    steps, widths = sorted(groups["step"].unique()), sorted(groups["width"].unique())
    fig, axes = plt.subplots(len(lines), len(columns), figsize=(3 * len(columns), 2.2 * len(lines)),
                             sharex=True, sharey="col", squeeze=False)
    for (row, param), panels in zip(lines, axes, strict=True):
        for group, ax in zip(columns, panels, strict=True):
            ax.set(xscale="log", yscale="log", xticks=widths, xticklabels=widths)
            ax.set_title(f"{row} {param}: {GROUPS[group]}", fontsize=8)
            ax.set_xticks([], minor=True)
            panel = groups[(groups["row"] == row) & (groups["param"] == param) & (groups["group"] == group)]
            for step, line in panel.groupby("step"):
                ax.plot(line["width"], line["abs_mean"], marker=".", color=plt.cm.viridis(step / max(steps)),
                        label=f"step {step}")
            ax.set_visible(not panel.empty)
    for ax in axes[-1]:
        ax.set_xlabel("width")
    for ax in axes[:, 0]:
        ax.set_ylabel("abs mean")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def widths_of(text: str) -> tuple[int, ...]:
    """--widths: two or more different positive multiples of the head size, comma-separated."""
    with contextlib.suppress(ValueError):
        widths = sorted({int(w) for w in text.split(",")})
        if len(widths) >= 2 and all(w > 0 and w % HEAD_DIM == 0 for w in widths):
            return tuple(widths)
    _fail("--widths", text, f"must be two or more different positive multiples of {HEAD_DIM} (heads of "
                            f"{HEAD_DIM}), comma-separated")


def _checked(args: argparse.Namespace) -> argparse.Namespace:
    args.widths = widths_of(args.widths)
    for key in ("steps", "seeds"):
        if getattr(args, key) < 1:
            _fail(f"--{key}", getattr(args, key), "must be an integer >= 1")
    if not is_finite(args.lr) or args.lr <= 0:
        _fail("--lr", args.lr, "must be a number > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddl.coord", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="where coord.{csv,png} go (default reports/coord)")
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="d_model, multiples of 32")
    parser.add_argument("--steps", type=int, default=4, help="AdamW updates (steps 0..N are recorded)")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seeds", type=int, default=2, help="initialisations averaged")
    try:
        args = _checked(parser.parse_args(argv))
    except ValueError as err:
        print(f"{parser.prog}: error: {err}")
        return 2
    out = args.out or paths.reports_dir() / "coord"
    try:
        out.mkdir(parents=True, exist_ok=True)           # a folder that cannot be made: before the training
        start = time.perf_counter()
        table = coord_check(widths=args.widths, steps=args.steps, lr=args.lr, seeds=args.seeds)
        seconds = time.perf_counter() - start
        paths.write_atomic(out / "coord.csv", table.to_csv(index=False))
        fig = figure(table)
        paths.write_atomic(out / "coord.png", lambda f: fig.savefig(f, format="png", dpi=80))
    except OSError as err:
        print(f"{parser.prog}: error: {err.filename or out}: {err.strerror or err}")
        return 1
    ratios = flatness(table).query(f"step == {args.steps}").pivot_table(index=["row", "group"], columns="param",
                                                                       values="ratio", sort=False)
    ratios = ratios.reindex(list(GROUPS), level="group")
    print(f"abs_mean at width {args.widths[-1]} / width {args.widths[0]}, step {args.steps}:")
    print(ratios[list(PARAMS)].round(2).to_string())
    print(f"{math.ceil(seconds)} s; written: {out / 'coord.csv'}, {out / 'coord.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
