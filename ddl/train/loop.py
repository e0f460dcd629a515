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
from ..model.mup import optimizer_groups
from . import checkpoint
from .config import RunConfig, TrainConfig
from .distributed import DistInfo, all_reduce_mean, any_rank_signal, cpu_threads, init_distributed, keep_freed_memory
from .loggers import MetricLogger
from .signals import DeferredSignals

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class NonFiniteLoss(RuntimeError):
    pass


class Interrupted(RuntimeError):
    """A signal stopped the run after a checkpoint was written; the caller may requeue it."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class Pruned(RuntimeError):
    """`stop_early` stopped the run at a validation (a search's pruner), after a checkpoint was written: a
    search that later wants the trial continues it from there."""


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


class _DeferredSignals(DeferredSignals):
    """Turn SIGINT/SIGTERM/SIGUSR1/SIGUSR2 into a flag read at step boundaries (a signal the
    process was started ignoring stays ignored).

    After the trainer checkpoints, `hand_over` restores the previous handlers and passes the
    signal on: submitit's SIGUSR2 handler then requeues the job, Python's SIGINT handler raises
    KeyboardInterrupt; where no one handles it (SIG_DFL), the trainer raises Interrupted. A
    SIGTERM that a handler only logged (submitit's) ends the process with SystemExit: SLURM kills
    after SIGTERM (requeue, preemption), and the requeued job resumes from this checkpoint.
    """

    def __init__(self):
        super().__init__(HANDLED_SIGNALS)

    def hand_over(self, signum: int, step: int, path: Path) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.__exit__()
        if not callable(previous):
            raise Interrupted(f"stopped by {signal.Signals(signum).name} at step {step}; checkpoint {path}", signum)
        previous(signum, None)          # may requeue+exit (submitit) or raise KeyboardInterrupt
        if signum == signal.SIGTERM:    # a scheduler's kill follows SIGTERM: leave on our checkpoint
            raise SystemExit(128 + signum)
        self.received = None
        self.__enter__()                # the previous handler chose to carry on: so do we


def mark_step(cfg: TrainConfig) -> None:
    """Under CUDA graphs (a compile_mode that replays them), a new step begins: the graphs may overwrite the last
    step's outputs. Nothing happens on CPU, where inductor records no graphs."""
    if cfg.compile and cfg.compile_mode != "default":
        torch.compiler.cudagraph_mark_step_begin()


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, split, cfg: TrainConfig, device: torch.device, info: DistInfo,
                  autocast) -> float:
    """Mean loss (nats/token) over the fixed held-out budget; windows are strided over ranks."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)      # loss * tokens, tokens
    for i, (x, y) in enumerate(val_batches(split, cfg.micro_batch, cfg.seq_len, cfg.eval_tokens)):
        if i % info.world_size != info.rank:
            continue
        mark_step(cfg)                                   # evaluation's shapes record graphs of their own
        with autocast:
            _, loss = model(x.to(device), y.to(device))
        totals += torch.tensor([loss.item() * y.numel(), y.numel()], dtype=torch.float64, device=device)
    model.train()
    if info.world_size > 1:
        torch.distributed.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def _val_metrics(val_loss: float, bytes_per_token: float) -> dict[str, float]:
    return {"val/loss": val_loss, "val/ppl": math.exp(min(val_loss, 50.0)),
            "val/bpb": val_loss / math.log(2) / bytes_per_token}


class Trainer:
    """One run in named steps (as torchtitan's trainer reads): setup, resume, train_step, validate,
    checkpoint, teardown. `fit()` runs the loop; `train()` is the one-call form."""

    def __init__(self, run: RunConfig, run_dir: Path, logger: MetricLogger | None, signature: str,
                 data_root: Path | None = None):
        """Sets up and resumes; `logger` may be given later (a job opens its MLflow run knowing the
        step it resumes from), before fit()."""
        self.run, self.cfg, self.run_dir, self.logger, self.signature = run, run.train, Path(run_dir), logger, signature
        self._setup_device()
        self._setup_data(data_root)
        self._setup_model()
        self.step, self.resumed_from = 0, None
        self.stop_early = None   # (step, val/loss) -> a reason to stop here, or None: a search's pruner, on rank 0
        self.last_checkpoint = self.resume()
        self.unchecked = None    # the last step whose loss was not yet seen finite: (state before it, loss, flag)
        if self.device.type == "cuda":
            self.flag, self.flag_ready = torch.zeros((), dtype=torch.bool).pin_memory(), torch.cuda.Event()
        self.logged = (self.step, time.time())
        self.model.checkpoint_blocks = self.cfg.activation_checkpointing
        if self.cfg.compile:                          # per block, before DDP wraps the model
            self.model.compile_blocks(mode=self.cfg.compile_mode)
        self.ddp = None
        if self.info.world_size > 1:   # gradients in the buckets' memory; buffers (RoPE's tables) never change
            self.ddp = DistributedDataParallel(self.model, gradient_as_bucket_view=True, broadcast_buffers=False,
                                               static_graph=self.accum == 1)   # the same graph each step, no no_sync
        self.forward = self.ddp or self.model
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda")

    # -- setup --------------------------------------------------------------------------------
    def _setup_device(self) -> None:
        torch.set_num_threads(cpu_threads())
        keep_freed_memory()
        cfg = self.cfg
        cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        if cuda and not torch.cuda.is_available():
            raise ValueError("train.device='cuda': this machine has no CUDA device (use auto or cpu)")
        self.info = init_distributed("cuda" if cuda else "cpu")
        self.device = torch.device("cuda", self.info.local_rank) if cuda else torch.device("cpu")
        if self.info.world_size > 1:
            print(f"rank {self.info.rank}/{self.info.world_size}: joined the {torch.distributed.get_backend()} "
                  f"process group", flush=True)

    def _setup_data(self, data_root: Path | None) -> None:
        self.dataset = open_dataset(prepare(self.run.data, root=data_root, progress=self.info.is_main))
        self.bytes_per_token = self.dataset.manifest["bytes_per_token"]["val"]
        self.loader = BatchLoader(self.dataset.train, self.cfg.micro_batch, self.cfg.seq_len, seed=self.run.rng_seed,
                                  rank=self.info.rank, world_size=self.info.world_size, device=self.device)
        self.accum = self.cfg.grad_accum(self.info.world_size)

    def _setup_model(self) -> None:
        cfg = self.cfg
        torch.manual_seed(self.run.rng_seed)                                          # same init on every rank
        self.model = GPT(self.run.model).to(self.device)
        groups = optimizer_groups(self.model, self.run.model, cfg.lr, cfg.weight_decay)
        # fused on CPU too: one kernel over every parameter, not a Python loop over each (DDL has twice the baseline's)
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_at(s, cfg) / cfg.lr)

    # -- checkpoints --------------------------------------------------------------------------
    def resume(self) -> Path | None:
        """Continue from the run directory's newest intact checkpoint, if it is this run's (a damaged
        one is reported and set aside)."""
        intact = checkpoint.newest_intact(self.run_dir, map_location=self.device)
        if intact is None:
            return None
        found, state = intact
        checkpoint.check_parameterization(found, state, self.run.model)
        if state["signature"] != self.signature:
            raise ValueError(f"run_dir={str(self.run_dir)!r}: holds checkpoints of run {state['signature']}, "
                             f"not {self.signature}; refusing to mix runs")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.loader.load_state_dict(state["loader"])
        checkpoint.restore_rng(state["rng"], self.device)
        self.step = self.resumed_from = state["step"]
        return found

    def checkpoint_state(self, at_step: int, loader_state: dict) -> dict:
        return {"step": at_step, "signature": self.signature, "run": self.run.to_dict(),
                "dataset": str(self.dataset.path), "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "loader": loader_state, "rng": checkpoint.rng_state(self.device)}

    def save(self, at_step: int, loader_state: dict) -> Path | None:
        """Rank 0: the metrics logged so far reach their store, then the checkpoint is written, so a run
        killed at any moment and resumed from it neither loses nor repeats a logged step."""
        if at_step == self.step:
            self.stop_if_nonfinite()                               # never a checkpoint past an unchecked step
        if not self.info.is_main:
            return None
        self.logger.flush()
        path = checkpoint.save(self.run_dir, self.checkpoint_state(at_step, loader_state), self.cfg.keep_checkpoints)
        if hasattr(self.logger, "checkpoint_saved"):
            self.logger.checkpoint_saved(path, at_step)
        return path

    # -- one step, validation -----------------------------------------------------------------
    def train_step(self) -> dict[str, torch.Tensor | float]:
        """One optimizer step over `accum` micro-batches; its loss and gradient norm stay on the device. A non-finite
        loss stops the run with NonFiniteLoss, after saving the last good state. On CUDA nothing waits on the GPU for
        it: the fused optimizer skips a non-finite step's update on the device (its found_inf), and the step's flag,
        copied to the host as it goes, is read at the next step, when the GPU has work queued behind it. On CPU the
        loss is checked at once (no queue to keep full)."""
        before = (self.step, self.loader.state_dict(), self.scheduler.state_dict())
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            mark_step(self.cfg)
            x, y = self.loader.next_batch()
            sync = self.ddp is None or micro == self.accum - 1
            with (contextlib.nullcontext() if sync else self.ddp.no_sync()), self.autocast:
                _, loss = self.forward(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
                (loss / self.accum).backward()
            loss_sum += loss.detach()
        train_loss = all_reduce_mean(loss_sum / self.accum, self.info)
        nonfinite = ~torch.isfinite(train_loss)
        self.stop_if_nonfinite()                                   # the previous step's flag
        self.unchecked = (before, train_loss, nonfinite)
        if self.device.type != "cuda":
            self.stop_if_nonfinite()                               # this step's, before its update
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        lr = lr_at(self.step, self.cfg)
        if self.device.type == "cuda":
            self.optimizer.found_inf = nonfinite.float()           # a non-finite step updates nothing
            self.flag.copy_(nonfinite, non_blocking=True)
            self.flag_ready.record()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {"train/loss": train_loss, "train/lr": lr, "train/grad_norm": grad_norm}

    def stop_if_nonfinite(self) -> None:
        """NonFiniteLoss, after saving the state before the unchecked step, if that step's loss was not finite."""
        if self.unchecked is None:
            return
        (step, loader_state, scheduler_state), loss, nonfinite = self.unchecked
        if self.device.type == "cuda":
            self.flag_ready.synchronize()
            bad = bool(self.flag)
        else:
            bad = bool(nonfinite)
        self.unchecked = None
        if not bad:
            return
        self.optimizer.zero_grad(set_to_none=True)
        if all(torch.isfinite(p).all() for p in self.model.parameters()):
            self.step = step                                        # its update was skipped: the state before it
            self.scheduler.load_state_dict(scheduler_state)
            where = f"last good state (step {step}) saved at {self.save(step, loader_state)}"
        else:
            where = f"parameters are non-finite; last checkpoint: {checkpoint.latest(self.run_dir)}"
        raise NonFiniteLoss(f"train loss is {loss.item()} at step {step + 1}; {where}")
    def validate(self) -> dict[str, float]:
        val_loss = evaluate_loss(self.model, self.dataset.val, self.cfg, self.device, self.info, self.autocast)
        return {**_val_metrics(val_loss, self.bytes_per_token), **self.state_ranks()}

    def state_ranks(self) -> dict[str, float]:
        """The state's effective rank per layer (d_v > 1) on the first validation batch: the same
        tokens at every evaluation."""
        x, _ = next(iter(val_batches(self.dataset.val, self.cfg.micro_batch, self.cfg.seq_len, self.cfg.eval_tokens)))
        self.model.eval()
        with self.autocast:
            ranks = self.model.state_ranks(x.to(self.device))
        self.model.train()
        return ranks

    def metrics_to_log(self, step_metrics: dict) -> dict[str, float]:
        """What to log at this step: the step's metrics and the betas at a logging step (the host waits on the device
        here, and only here), validation at an evaluation step; tokens/s over the steps since the last log."""
        cfg, metrics = self.cfg, {}
        if self.step % cfg.log_every == 0 or self.step == cfg.steps:
            self.stop_if_nonfinite()
            now = time.time()
            tokens_per_s = cfg.batch_tokens * (self.step - self.logged[0]) / max(now - self.logged[1], 1e-9)
            self.logged = (self.step, now)
            metrics.update({key: float(value) for key, value in step_metrics.items()}, **self.model.beta_stats())
            metrics["train/tokens_per_s"] = tokens_per_s
            if self.device.type == "cuda":                 # CUDA graphs' pools included
                metrics["train/gpu_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
        if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
            metrics.update(self.validate())
        return metrics

    # -- the loop -----------------------------------------------------------------------------
    def fit(self) -> RunResult:
        cfg, started, tokens_seen = self.cfg, time.time(), 0
        final: dict[str, float] = {}
        self.model.train()
        with _DeferredSignals() as signals:
            while self.step < cfg.steps:
                metrics = self.metrics_to_log(self.train_step())
                tokens_seen += cfg.batch_tokens
                if metrics and self.info.is_main:
                    self.logger.log_metrics(metrics, self.step)
                final.update(metrics)
                stop = self.received(signals)
                pruned = self.pruned(metrics)
                if self.step % cfg.ckpt_every == 0 or self.step == cfg.steps or stop or pruned:
                    self.last_checkpoint = self.save(self.step, self.loader.state_dict())
                if stop:
                    signals.hand_over(stop, self.step, self.last_checkpoint)
                if pruned:
                    self.teardown()
                    raise Pruned(f"step {self.step}: {pruned}")
        if "val/loss" not in final:                                           # resumed an already finished run
            final.update(self.validate())
        self.teardown()
        keep = ("train/loss", "val/loss", "val/ppl", "val/bpb", "beta/mean", "beta/frac_gt1")
        return RunResult({k: final[k] for k in keep if k in final}, self.step, tokens_seen, time.time() - started,
                         self.resumed_from, str(self.last_checkpoint) if self.last_checkpoint else None,
                         self.device.type, {"unigram_xent_val": self.dataset.manifest["unigram_xent_val"],
                                            "dataset": str(self.dataset.path)})

    def received(self, signals: _DeferredSignals) -> int | None:
        """The signal to stop on at this step: the process's own; with several ranks, the one any rank received, asked
        at logging steps only (the same steps on every rank: they stop together), as asking waits on the devices."""
        cfg = self.cfg
        if self.info.world_size > 1 and self.step % cfg.log_every and self.step != cfg.steps:
            return None
        return any_rank_signal(signals.received, self.info, self.device)

    def pruned(self, metrics: dict[str, float]) -> str | None:
        """stop_early's reason to end the run at this validation (before its last step), the same on every rank."""
        if "val/loss" not in metrics or self.step >= self.cfg.steps:     # every rank validates at the same steps
            return None
        reason = self.stop_early(self.step, metrics["val/loss"]) if self.stop_early and self.info.is_main else None
        if any_rank_signal(1 if reason else None, self.info, self.device) is None:
            return None
        return reason or "stopped by rank 0's pruner"

    def teardown(self) -> None:
        """DDP's reducer must not be the last owner of the process group: it would free it holding the
        GIL while gloo's worker threads may wait for the GIL (a hang seen at the end of a 2-rank run);
        destroy_process_group releases it."""
        if self.info.world_size > 1:
            self.forward = self.ddp = None
            gc.collect()
            torch.distributed.destroy_process_group()


def train(run: RunConfig, run_dir: Path, logger: MetricLogger, signature: str, *,
          data_root: Path | None = None) -> RunResult:
    return Trainer(run, run_dir, logger, signature, data_root).fit()
