"""TrainConfig and RunConfig: what a run is a pure function of (with its seed).

Schedules (Hydra YAML in conf/train/ mirrors these):
- paper: 100k steps, 480 x 1024 = 491,520 tokens per step, lr 1e-3, 2000 warmup, cosine (paper 5.1)
- cpu:   a few hundred steps of 8 x 128 tokens: the embedded demo on a laptop core
A token budget that grows with the model (a scaling study): `tokens_per_param` = c sets steps to
ceil(c * N / batch_tokens), N the backbone's non-embedding parameters (ddl.model.config.backbone_params).
A schedule of one shape at every horizon: `warmup_frac` = f sets warmup_steps to round(f * steps) (the cosine
after it already spans the rest of the run, whatever its length), so runs whose steps differ warm up over the
same share of them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass

from ..data.config import DataConfig
from ..model.config import LATER_FIELDS, ModelConfig, backbone_params
from ..validation import failure, is_finite, is_int, is_number, shown


_fail = failure("train")
SEED_LIMIT = 2 ** 63   # torch.manual_seed's range


def check_model_numbers(model: ModelConfig) -> None:
    """The model's real-valued knobs are numbers a model can be built and trained with: finite, and
    positive where a zero divides (rope_base) or a negative spread means nothing (init_std)."""
    fail = failure()
    for key in ("k_eps", "v_sigmoid_scale", "norm_eps"):
        if not is_finite(getattr(model, key)):
            fail(key, getattr(model, key), "must be a finite number >= 0")
    for key in ("rope_base", "init_std"):
        if not is_finite(getattr(model, key)) or getattr(model, key) <= 0:
            fail(key, getattr(model, key), "must be a finite number > 0")
    if model.read_init is not None and not is_finite(model.read_init):
        fail("read_init", model.read_init, "must be null (1/d_v) or a finite number")


# When a run logs, validates and checkpoints, and whether it recomputes activations: none of it changes the weights
# it learns.
BOOKKEEPING = ("log_every", "eval_every", "ckpt_every", "keep_checkpoints", "checkpoint_artifact",
               "activation_checkpointing")
# How torch.compile launches the compiled blocks: reduce-overhead and max-autotune replay each step's kernels as CUDA
# graphs (nothing on CPU). How a step is launched, not what it computes: not in the signature.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
# Which checkpoints a run uploads to its MLflow run (one artifact, replaced): every one, the last, or none.
CHECKPOINT_ARTIFACTS = ("latest", "final", "none")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 300
    batch_tokens: int = 1024          # global tokens per optimizer step (all ranks, all micro-steps)
    micro_batch: int = 8              # sequences per forward per rank
    seq_len: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 0.1         # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_tokens: int = 16384
    ckpt_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    compile: bool = False
    compile_mode: str = "default"     # COMPILE_MODES (with compile=true)
    activation_checkpointing: bool = False   # recompute each block's activations in backward: memory for time
    device: str = "auto"              # auto | cpu | cuda
    checkpoint_artifact: str = "latest"   # CHECKPOINT_ARTIFACTS: what travels with the run to its store
    tokens_per_param: float | None = None   # c: train on c * N tokens (sets steps); null: `steps` does
    warmup_frac: float | None = None        # f: warm up over round(f * steps) steps; null: `warmup_steps` does

    def __post_init__(self) -> None:
        for key in ("steps", "batch_tokens", "micro_batch", "seq_len", "eval_every", "eval_tokens", "ckpt_every",
                    "keep_checkpoints", "log_every"):
            value = getattr(self, key)
            if not is_int(value) or value < 1:
                _fail(key, value, "must be an integer >= 1")
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            _fail("warmup_steps", self.warmup_steps, "must be an integer >= 0")
        if self.batch_tokens % (self.micro_batch * self.seq_len):
            _fail("batch_tokens", self.batch_tokens,
                  f"must be a multiple of micro_batch*seq_len = {self.micro_batch * self.seq_len}")
        for key, low, high, low_open in (("lr", 0.0, 1.0, True), ("min_lr_ratio", 0.0, 1.0, False),
                                         ("beta1", 0.0, 1.0, False), ("beta2", 0.0, 1.0, False),
                                         ("weight_decay", 0.0, 10.0, False), ("grad_clip", 0.0, 1e9, True)):
            value = getattr(self, key)
            if not is_number(value) or not low <= value <= high \
                    or (low_open and value == low):
                _fail(key, value, f"must be a number in {'(' if low_open else '['}{low:g}, {high:g}]")
        if self.eval_tokens < self.seq_len:
            _fail("eval_tokens", self.eval_tokens, f"must be >= seq_len={self.seq_len} (one validation window)")
        for key in ("compile", "activation_checkpointing"):
            if not isinstance(getattr(self, key), bool):
                _fail(key, getattr(self, key), "must be true or false")
        if self.compile_mode not in COMPILE_MODES:
            _fail("compile_mode", self.compile_mode, f"must be one of {', '.join(COMPILE_MODES)}")
        if self.compile_mode != "default" and not self.compile:
            _fail("compile_mode", self.compile_mode, "needs train.compile=true (the mode is how the blocks compile)")
        if self.device not in ("auto", "cpu", "cuda"):
            _fail("device", self.device, "must be one of auto, cpu, cuda")
        if self.checkpoint_artifact not in CHECKPOINT_ARTIFACTS:
            _fail("checkpoint_artifact", self.checkpoint_artifact, f"must be one of {', '.join(CHECKPOINT_ARTIFACTS)}")
        if self.tokens_per_param is not None and not (is_finite(self.tokens_per_param) and self.tokens_per_param > 0):
            _fail("tokens_per_param", self.tokens_per_param,
                  "must be null (train.steps sets the budget) or a finite number > 0 (tokens per non-embedding "
                  "parameter)")
        if self.warmup_frac is not None and not (is_number(self.warmup_frac) and 0 <= self.warmup_frac < 1):
            _fail("warmup_frac", self.warmup_frac,
                  "must be null (train.warmup_steps sets the warmup) or a number in [0, 1) (the run's share)")

    def grad_accum(self, world_size: int) -> int:
        per_step = self.micro_batch * self.seq_len * world_size
        if self.batch_tokens % per_step:
            raise ValueError(f"train.batch_tokens={self.batch_tokens}: must be a multiple of "
                             f"micro_batch*seq_len*world_size = {per_step}")
        return self.batch_tokens // per_step


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    seed: int = 0
    replica: int = 0     # an independent copy of the run (an A/A pair's other row): its own init and data order

    def __post_init__(self) -> None:
        if not is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed={shown(self.seed)}: must be an integer in [0, 2**63)")
        if not is_int(self.replica) or not 0 <= self.replica < SEED_LIMIT:
            raise ValueError(f"replica={shown(self.replica)}: must be an integer in [0, 2**63)")
        check_model_numbers(self.model)
        if self.model.vocab_size != self.data.model_vocab_size():
            raise ValueError(f"model.vocab_size={self.model.vocab_size}: the {self.data.tokenizer} tokenizer needs "
                             f"{self.data.model_vocab_size()}")
        if self.train.seq_len > self.model.max_seq_len:
            raise ValueError(f"train.seq_len={self.train.seq_len}: must be <= model.max_seq_len="
                             f"{self.model.max_seq_len}")
        if self.train.tokens_per_param is not None:    # the budget c * N decides the steps
            budget = self.train.tokens_per_param * backbone_params(self.model)
            steps = max(1, math.ceil(budget / self.train.batch_tokens))
            object.__setattr__(self, "train", dataclasses.replace(self.train, steps=steps))
        if self.train.warmup_frac is not None:        # the share f of the steps decides the warmup
            warmup = round(self.train.warmup_frac * self.train.steps)
            object.__setattr__(self, "train", dataclasses.replace(self.train, warmup_steps=warmup))

    @property
    def rng_seed(self) -> int:
        """The seed of the run's random streams (init, data order): its seed, or for replica r > 0 a hash of both,
        so that a replica pairs with its row by seed while drawing nothing the row draws."""
        if not self.replica:
            return self.seed
        return int(hashlib.sha256(f"{self.seed}:{self.replica}".encode()).hexdigest(), 16) % SEED_LIMIT

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        return cls(ModelConfig.from_saved(d["model"]), DataConfig(**d["data"]), TrainConfig(**d["train"]), d["seed"],
                   d.get("replica", 0))

    def effective_dict(self) -> dict:
        """What changes the numbers: the signature is a hash of this (and the MLflow params are it).
        Not in it: the data fields the source ignores, when the run logs, validates and saves, how a step
        is launched (compile_mode), a model field added later while it holds the value earlier runs had
        (LATER_FIELDS), replica 0, and the token budget's c and the warmup's share f (what they change is the
        steps they set)."""
        effective = RunConfig(self.model.effective(), self.data, self.train, self.seed, self.replica).to_dict()
        if not self.replica:
            del effective["replica"]             # replica 0 is the run itself: the signature runs had before it
        effective["data"] = self.data.source_params()
        for key, earlier in LATER_FIELDS.items():
            if effective["model"][key] == earlier:
                del effective["model"][key]
        for key in (*BOOKKEEPING, "compile_mode", "tokens_per_param", "warmup_frac"):
            del effective["train"][key]
        return effective

    def signature(self) -> str:
        """A short hash of the effective config: names the run's directory, dedups and resumes sweeps. Hashed once
        (the config is frozen): a plan asks for each job's a dozen times."""
        if "_signature" not in self.__dict__:
            effective = json.dumps(self.effective_dict(), sort_keys=True)
            object.__setattr__(self, "_signature", hashlib.sha256(effective.encode()).hexdigest()[:12])
        return self.__dict__["_signature"]
