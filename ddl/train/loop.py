"""One run: data -> model -> AdamW loop with warmup+cosine, validation, checkpoints, resume, DDP."""

from __future__ import annotations

import contextlib
import gc
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from ..data import BatchLoader, open_dataset, prepare, val_batches
from ..model import GPT
from . import checkpoint
from .config import RunConfig, TrainConfig
from .distributed import DistInfo, all_reduce_mean, any_rank_signal, cpu_threads, init_distributed, keep_freed_memory
from .loggers import MetricLogger

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class NonFiniteLoss(RuntimeError):
    pass


class Interrupted(RuntimeError):
    """A signal stopped the run after a checkpoint was written; the caller may requeue it."""


@dataclass
class RunResult:
    final: dict[str, float]
    steps: int                       # the run's step count
    tokens: int                      # tokens trained on in this call (0 when it resumed a finished run)
    seconds: float
    resumed_from: int | None = None
    checkpoint: str | None = None    # the run's newest checkpoint, also when this call resumed a finished run
    device: str = "cpu"
    extra: dict = field(default_factory=dict)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The lr of optimizer step `step` (0-based): linear warmup to lr over warmup_steps, then a
    cosine that reaches lr * min_lr_ratio at step == steps, one past the last update."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices (linear weights, the tied embedding, conv kernels) only; never on
    norms' gains, biases, beta-gate biases or read vectors."""
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class _DeferredSignals:
    """Turn SIGINT/SIGTERM/SIGUSR1/SIGUSR2 into a flag read at step boundaries (a signal the
    process was started ignoring stays ignored).

    After the trainer checkpoints, `hand_over` restores the previous handlers and passes the
    signal on: submitit's SIGUSR2 handler then requeues the job, Python's SIGINT handler raises
    KeyboardInterrupt; where no one handles it (SIG_DFL), the trainer raises Interrupted. A
    SIGTERM that a handler only logged (submitit's) ends the process with SystemExit: SLURM kills
    after SIGTERM (requeue, preemption), and the requeued job resumes from this checkpoint.
    """

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self):
        with contextlib.suppress(ValueError):  # only the main thread may install handlers
            for sig in HANDLED_SIGNALS:
                if signal.getsignal(sig) != signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def hand_over(self, signum: int, step: int, path: Path) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.__exit__()
        if not callable(previous):
            raise Interrupted(f"stopped by {signal.Signals(signum).name} at step {step}; checkpoint {path}")
        previous(signum, None)          # may requeue+exit (submitit) or raise KeyboardInterrupt
        if signum == signal.SIGTERM:    # a scheduler's kill follows SIGTERM: leave on our checkpoint
            raise SystemExit(128 + signum)
        self.received = None
        self.__enter__()                # the previous handler chose to carry on: so do we


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, split, cfg: TrainConfig, device: torch.device, info: DistInfo,
                  autocast) -> float:
    """Mean loss (nats/token) over the fixed held-out budget; windows are strided over ranks."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)      # loss * tokens, tokens
    for i, (x, y) in enumerate(val_batches(split, cfg.micro_batch, cfg.seq_len, cfg.eval_tokens)):
        if i % info.world_size != info.rank:
            continue
        with autocast:
            _, loss = model(x.to(device), y.to(device))
        totals += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64, device=device)
    model.train()
    if info.world_size > 1:
        torch.distributed.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def train(run: RunConfig, run_dir: Path, logger: MetricLogger, signature: str, *,
          data_root: Path | None = None) -> RunResult:
    cfg = run.train
    run_dir = Path(run_dir)
    torch.set_num_threads(cpu_threads())
    keep_freed_memory()
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise ValueError("train.device='cuda': this machine has no CUDA device (use auto or cpu)")
    info = init_distributed("cuda" if cuda else "cpu")
    device = torch.device("cuda", info.local_rank) if cuda else torch.device("cpu")
    if info.world_size > 1:
        print(f"rank {info.rank}/{info.world_size}: joined the {torch.distributed.get_backend()} process group",
              flush=True)
    dataset = open_dataset(prepare(run.data, root=data_root, progress=info.is_main))
    bytes_per_token = dataset.manifest["bytes_per_token"]["val"]

    torch.manual_seed(run.seed)                                          # same init on every rank
    model = GPT(run.model).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                  fused=device.type == "cuda")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, cfg) / cfg.lr)
    loader = BatchLoader(dataset.train, cfg.micro_batch, cfg.seq_len, seed=run.seed, rank=info.rank,
                         world_size=info.world_size)
    accum = cfg.grad_accum(info.world_size)

    step, resumed_from = 0, None
    found = checkpoint.latest(run_dir)
    if found is not None:
        state = checkpoint.load(found, map_location=device)
        if state["signature"] != signature:
            raise ValueError(f"run_dir={str(run_dir)!r}: holds checkpoints of run {state['signature']}, "
                             f"not {signature}; refusing to mix runs")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        loader.load_state_dict(state["loader"])
        checkpoint.restore_rng(state["rng"], device)
        step = resumed_from = state["step"]

    ddp = DistributedDataParallel(model) if info.world_size > 1 else None
    forward = ddp or model
    if cfg.compile:
        forward = torch.compile(forward)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def save(at_step: int, loader_state: dict) -> Path | None:
        if not info.is_main:
            return None
        return checkpoint.save(run_dir, {
            "step": at_step, "signature": signature, "run": run.to_dict(), "dataset": str(dataset.path),
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "loader": loader_state, "rng": checkpoint.rng_state(device)}, cfg.keep_checkpoints)

    started, tokens_seen, last_path = time.time(), 0, found
    final: dict[str, float] = {}
    model.train()
    with _DeferredSignals() as signals:
        while step < cfg.steps:
            loader_state = loader.state_dict()
            t0 = time.time()
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                x, y = loader.next_batch()
                sync = ddp is None or micro == accum - 1
                with (contextlib.nullcontext() if sync else ddp.no_sync()), autocast:
                    _, loss = forward(x.to(device), y.to(device))
                    (loss / accum).backward()
                loss_sum += loss.detach()
            train_loss = all_reduce_mean(loss_sum / accum, info).item()
            if not math.isfinite(train_loss):
                optimizer.zero_grad(set_to_none=True)
                if all(torch.isfinite(p).all() for p in model.parameters()):
                    where = f"last good state (step {step}) saved at {save(step, loader_state)}"
                else:
                    where = f"parameters are non-finite; last checkpoint: {checkpoint.latest(run_dir)}"
                raise NonFiniteLoss(f"train loss is {train_loss} at step {step + 1}; {where}")
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip).item()
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            tokens_seen += cfg.batch_tokens
            metrics: dict[str, float] = {}
            if step % cfg.log_every == 0 or step == cfg.steps:
                metrics.update({"train/loss": train_loss, "train/lr": lr, "train/grad_norm": grad_norm,
                                "train/tokens_per_s": cfg.batch_tokens / max(time.time() - t0, 1e-9),
                                **model.beta_stats()})
            if step % cfg.eval_every == 0 or step == cfg.steps:
                val_loss = evaluate_loss(model, dataset.val, cfg, device, info, autocast)
                metrics.update({"val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50.0)),
                                "val/bpb": val_loss / math.log(2) / bytes_per_token})
            if metrics and info.is_main:
                logger.log_metrics(metrics, step)
            final.update(metrics)
            stop = any_rank_signal(signals.received, info, device)   # all ranks stop at the same step
            if step % cfg.ckpt_every == 0 or step == cfg.steps or stop:
                last_path = save(step, loader.state_dict())
            if stop:
                signals.hand_over(stop, step, last_path)
    if "val/loss" not in final:                                           # resumed an already finished run
        val_loss = evaluate_loss(model, dataset.val, cfg, device, info, autocast)
        final.update({"val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50.0)),
                      "val/bpb": val_loss / math.log(2) / bytes_per_token})
    if info.world_size > 1:  # DDP's reducer must not be the last owner of the process group: it would free it
        del forward, ddp       # holding the GIL, while gloo's worker threads may wait for the GIL to finish
        gc.collect()           # (a hang seen at the end of a 2-rank run); destroy_process_group releases it
        torch.distributed.destroy_process_group()
    keep = ("train/loss", "val/loss", "val/ppl", "val/bpb", "beta/mean", "beta/frac_gt1")
    return RunResult({k: final[k] for k in keep if k in final}, step, tokens_seen, time.time() - started,
                     resumed_from, str(last_path) if last_path else None, device.type,
                     {"unigram_xent_val": dataset.manifest["unigram_xent_val"], "dataset": str(dataset.path)})
