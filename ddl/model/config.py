"""ModelConfig: the only thing a model is built from (a frozen, self-validating dataclass).

Knob semantics (paper sections 3-4, appendix B; the reference implementation where it is silent):
- residual: 'baseline' (x <- x + F(norm x)) or 'ddl' (the Delta residual).
- dv: value channels d_v of the state X (d x d_v). d_v = 1 is Eq. 3.1, d_v > 1 section 4.2.
- conv: how the expanded state is read and initialised (d_v > 1 only).
    none   repeat the embedding over d_v; compress with a causal depthwise conv over T + read vector
    ec     like none, but expand the embedding with an identity-initialised causal conv over T
    cc     compress with a per-feature conv along the d_v axis + read vector
    cc_ec  cc + ec
- state_conv_kernel: the compressor's kernel. Over T for none/ec (default 4); along d_v for
  cc/cc_ec (default d_v, the paper's setting; larger than d_v is an error).
- cc_padding: how the conv along d_v pads (cc/cc_ec). 'centered' (left (K-1)//2; the reference
  code's default, what its models were trained with) or 'causal' (left K-1; paper appendix B.3
  and the reference's accelerated file behind a flag that is off by default).
- beta_init: the gate's value at init, in [0, 2]; the gate bias is logit(beta_init / 2).
- n_h: Delta updates per sublayer (DeltaProduct, Siems et al. 2025, applied depth-wise): the state
  goes through n_h updates in sequence, a product of n_h generalised Householder transitions.
  Step 1 is the paper's; each further step j has its own key map W_k^j h (a d x d Linear of the
  sublayer output, as DeltaProduct gives each step its own key projection: the composed write
  has rank n_h only if the keys can point apart), its own gate beta_j (of c) and value map
  (of x_in, k-Map; of h, v-Map). n_h = 1 is the paper's model, with its signature.
- init: how weights start. 'reference' (the reference code's init_gpt_weights, what the paper's
  numbers came from): tied embedding N(0, init_std), every other matrix and conv kernel
  N(0, 0.5/sqrt(d)), the attention and MLP output projections N(0, 0.5/sqrt(d L)), W_v's bias
  PyTorch's Linear default U(+-1/sqrt(d)). 'gpt2' (GPT-2 / nanoGPT style, the paper's text names
  muP but gives no recipe): every Linear N(0, init_std), output projections init_std/sqrt(2L),
  biases 0, conv kernels U(+-1/sqrt(K)). Both: norm weights 1, read vector w_p = read_init,
  beta's bias logit(beta_init/2), the EC expander the identity.
- init_streams: where those normal draws come from. 'per_parameter': each matrix from a stream of
  its own, seeded by the run's seed and the parameter's name, so that two rows at one seed start
  every parameter they share alike (common random numbers: pairing by seed removes that share of
  the noise); 'sequential': one stream in parameter order (a DDL row's extra maps shift every draw
  after them), how runs were initialised before the field existed.
- norm_eps: every RMSNorm's eps (block, QK and final norms); 1e-5 as in the reference code.
- qk_norm: 'after_rope' (the reference: rotate q, k, then RMSNorm each head) or 'before_rope'
  (RMSNorm, then rotate: how checkpoints written before reference parity were trained).
- param: the parameterization. 'sp' (standard: init and learning rate as given, the reference
  code's) or 'mup' (ddl/model/mup.py: µP, Yang et al. 2022; the paper trains with it but ships no
  recipe), under which a learning rate tuned at one width carries to others. mup_base_width: the
  width at which mup equals sp (default 128, the CPU study's tiny; the cluster sweeps set their own).
  logit_mult and embed_lr_mult: the base width's output multiplier (the logits' factor) and the tied
  embedding's learning-rate factor, the two constants µP leaves free (the mup package's output_mult and
  input lr); under mup they carry to every width with the rest. 1 and 1: the reference code's model.
- depth_param: how depth scales. 'none' (the reference code) or 'completep' (ddl/model/mup.py: CompleteP,
  Dey et al. 2025, alpha = 1): each residual branch's output (the baseline) or each Delta write's value v
  (DDL; beta is never scaled) times depth_base / n_layer, the output projections' init at depth_base's,
  and Adam's eps of the blocks' parameters times depth_base / n_layer. At n_layer = depth_base it is the
  'none' model bit for bit. depth_base: that depth (default 4, the CPU study's tiny). 'none' is the default:
  across 2-8 layers completep cut the baseline's best-lr drift but tripled DDL's (docs/results.md).
- state_dtype: what the state X is stored in between the Delta ops, which compute in fp32 whatever it
  is: 'auto' (bf16 on CUDA, where the state's memory traffic is the Delta residual's cost; the
  embedding's dtype elsewhere: fp32, where parity with the reference code lives), 'fp32' or 'bf16'.
- kernels: how the Delta residual's own ops run; the same numbers up to float rounding (a
  separate run, like train.compile).
    fused     hand-written autograd kernels (ddl/model/fused): C++ loops on CPU, built once per
              machine on first use; PyTorch ops elsewhere
    compiled  the plain PyTorch forms of the update, the read and a sublayer's norm with its gate maps
              through torch.compile: kernels generated per op (C++ on CPU, Triton on CUDA), compiled
              on first use; under train.compile, fused with their neighbours
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..validation import failure, is_int, is_number

RESIDUALS = ("baseline", "ddl")
CONVS = ("none", "ec", "cc", "cc_ec")
MAPPINGS = ("k", "v")
BETA_ESTIMATORS = ("linear", "mlp")
KERNELS = ("fused", "compiled")
INITS = ("reference", "gpt2")
INIT_STREAMS = ("per_parameter", "sequential")
PARAMS = ("sp", "mup")
CC_PADDINGS = ("centered", "causal")
QK_NORMS = ("after_rope", "before_rope")
STATE_DTYPES = ("auto", "fp32", "bf16")
DEPTH_PARAMS = ("none", "completep")
# The knobs of the Delta residual: none of them shapes a baseline.
DDL_KNOBS = ("dv", "conv", "mapping", "beta_init", "beta_estimator", "beta_hidden", "k_eps", "kernels",
             "v_sigmoid_scale", "state_conv_kernel", "embed_conv_kernel", "read_init", "cc_padding", "n_h",
             "state_dtype")
# Fields added after run signatures were first written, with the value every earlier run had: at
# that value a field is left out of the run's effective config, so earlier signatures still hold.
LATER_FIELDS = dict(n_h=1, param="sp", mup_base_width=128, state_dtype="auto", logit_mult=1.0, embed_lr_mult=1.0,
                    depth_param="none", depth_base=4, init_streams="sequential")
# What a config saved before these fields existed was built with (a checkpoint written before
# reference parity): loading it with these values computes the function it was trained as.
PRE_PARITY = dict(init="gpt2", norm_eps=1e-6, qk_norm="before_rope", cc_padding="causal")
DEFAULT_TIME_KERNEL = 4
CHANNEL_CONVS = ("cc", "cc_ec")          # convolutions along d_v: their kernel defaults to d_v


_fail = failure()


def _need_int(key: str, value, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        _fail(key, value, f"must be an integer >= {minimum}")


def _need_choice(key: str, value, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(key, value, f"must be one of {', '.join(choices)}")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 6
    d_model: int = 768
    max_seq_len: int = 1024
    residual: str = "baseline"
    dv: int = 1
    conv: str = "none"
    mapping: str = "k"
    beta_init: float = 1.0
    beta_estimator: str = "linear"
    beta_hidden: int = 128
    k_eps: float = 1e-5
    v_sigmoid_scale: float = 4.0
    state_conv_kernel: int | None = None
    embed_conv_kernel: int = DEFAULT_TIME_KERNEL
    read_init: float | None = None
    kernels: str = "fused"
    rope_base: float = 10000.0
    init: str = "reference"
    init_std: float = 0.02
    init_streams: str = "sequential"
    norm_eps: float = 1e-5
    qk_norm: str = "after_rope"
    cc_padding: str = "centered"
    n_h: int = 1
    param: str = "sp"
    mup_base_width: int = 128
    state_dtype: str = "auto"
    logit_mult: float = 1.0
    embed_lr_mult: float = 1.0
    depth_param: str = "none"
    depth_base: int = 4

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len", "dv", "beta_hidden",
                    "embed_conv_kernel", "n_h", "mup_base_width", "depth_base"):
            _need_int(key, getattr(self, key), 1)
        _need_choice("residual", self.residual, RESIDUALS)
        _need_choice("conv", self.conv, CONVS)
        _need_choice("mapping", self.mapping, MAPPINGS)
        _need_choice("beta_estimator", self.beta_estimator, BETA_ESTIMATORS)
        _need_choice("kernels", self.kernels, KERNELS)
        _need_choice("init", self.init, INITS)
        _need_choice("init_streams", self.init_streams, INIT_STREAMS)
        _need_choice("qk_norm", self.qk_norm, QK_NORMS)
        _need_choice("cc_padding", self.cc_padding, CC_PADDINGS)
        _need_choice("param", self.param, PARAMS)
        _need_choice("state_dtype", self.state_dtype, STATE_DTYPES)
        _need_choice("depth_param", self.depth_param, DEPTH_PARAMS)
        for key in ("logit_mult", "embed_lr_mult"):
            if not is_number(getattr(self, key)) or not 0 < getattr(self, key) < float("inf"):
                _fail(key, getattr(self, key), "must be a finite number > 0 (a multiplier; 1: none)")
        if self.param == "mup" and self.init != "reference":
            _fail("init", self.init, "must be reference with param=mup (µP scales the reference init by width)")
        if self.d_model % self.n_head:
            _fail("d_model", self.d_model, f"must be divisible by n_head={self.n_head}")
        if (self.d_model // self.n_head) % 2:
            _fail("d_model", self.d_model, f"d_model / n_head must be even for RoPE (n_head={self.n_head})")
        if not is_number(self.beta_init) or not 0.0 <= self.beta_init <= 2.0:
            _fail("beta_init", self.beta_init, "must be a number in [0, 2] (beta = 2*sigmoid(.) lives there)")
        for key in ("k_eps", "v_sigmoid_scale", "norm_eps"):
            value = getattr(self, key)
            if not is_number(value) or value < 0:
                _fail(key, value, "must be a number >= 0")
        if self.state_conv_kernel is not None:
            _need_int("state_conv_kernel", self.state_conv_kernel, 1)
        if self.residual == "ddl":
            if self.conv != "none" and self.dv == 1:
                _fail("conv", self.conv, "needs dv > 1 (the conv variants act on the expanded state); use conv=none")
            if self.channel_conv and self.state_kernel > self.dv:
                _fail("state_conv_kernel", self.state_kernel, f"must be <= dv={self.dv} for conv={self.conv}")

    @classmethod
    def from_saved(cls, fields: dict) -> "ModelConfig":
        """A config read back from a checkpoint; fields it predates take the values runs had before them."""
        return cls(**{**LATER_FIELDS, **PRE_PARITY, **fields})

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def expanded(self) -> bool:
        """True when the residual state is a d x d_v matrix per token (DDL with d_v > 1)."""
        return self.residual == "ddl" and self.dv > 1

    @property
    def channel_conv(self) -> bool:
        return self.conv in CHANNEL_CONVS

    @property
    def embed_conv(self) -> bool:
        return self.conv in ("ec", "cc_ec")

    @property
    def state_kernel(self) -> int:
        if self.state_conv_kernel is not None:
            return self.state_conv_kernel
        return self.dv if self.channel_conv else DEFAULT_TIME_KERNEL

    @property
    def read_value(self) -> float:
        return 1.0 / self.dv if self.read_init is None else float(self.read_init)

    def effective(self) -> "ModelConfig":
        """The canonical config: knobs that cannot change the numbers are reset to defaults.

        Two configs with the same effective() build the same model from the same seed, so the
        launcher's run signature (a hash of this) dedups e.g. baseline dv=1 and baseline dv=4.
        """
        defaults = ModelConfig()
        cfg = self if self.param == "mup" else dataclasses.replace(self, mup_base_width=defaults.mup_base_width)
        if self.depth_param == "none":
            cfg = dataclasses.replace(cfg, depth_base=defaults.depth_base)
        cfg = dataclasses.replace(cfg, logit_mult=float(self.logit_mult), embed_lr_mult=float(self.embed_lr_mult))
        if self.residual == "baseline":
            return dataclasses.replace(cfg, **{k: getattr(defaults, k) for k in DDL_KNOBS})
        changes: dict = {"beta_init": float(self.beta_init)}
        if self.beta_estimator == "linear":
            changes["beta_hidden"] = defaults.beta_hidden
        if self.expanded:
            changes["state_conv_kernel"] = self.state_kernel
            changes["read_init"] = self.read_value
        else:
            changes.update(state_conv_kernel=None, read_init=None)
        if not self.embed_conv:
            changes["embed_conv_kernel"] = defaults.embed_conv_kernel
        if not (self.expanded and self.channel_conv and self.state_kernel > 1):   # one tap pads nothing
            changes["cc_padding"] = defaults.cc_padding
        return dataclasses.replace(cfg, **changes)


# Paper Table 4 (small, medium); CPU sizes for tests, the embedded demo and the CPU scaling study
# (micro, tiny, mini: heads of 32, non-embedding parameters 0.10M, 0.79M, 1.84M); and large, the
# GPT-3 760M shape with the paper's heads of 128 (757M with GPT-2's vocabulary), for a cluster's
# scaling sweep. Sizes are ordered by parameters.
SIZES: dict[str, dict[str, int]] = {
    "micro": dict(n_layer=2, n_head=2, d_model=64, max_seq_len=256),
    "tiny": dict(n_layer=4, n_head=4, d_model=128, max_seq_len=256),
    "mini": dict(n_layer=6, n_head=5, d_model=160, max_seq_len=256),
    "small": dict(n_layer=12, n_head=6, d_model=768, max_seq_len=1024),
    "medium": dict(n_layer=24, n_head=8, d_model=1024, max_seq_len=1024),
    "large": dict(n_layer=24, n_head=12, d_model=1536, max_seq_len=1024),
}


def model_config(size: str, head_size: int | None = None, **overrides) -> ModelConfig:
    """The size's dims with `overrides`; head_size (heads of a fixed size, as µP's width sweeps keep
    them) sets n_head = d_model / head_size."""
    if size not in SIZES:
        _fail("model", size, f"must be one of {', '.join(SIZES)}")
    fields = {**SIZES[size], **overrides}
    if head_size is not None:
        _need_int("head_size", head_size, 2)
        if fields["d_model"] % head_size:
            _fail("head_size", head_size, f"must divide d_model={fields['d_model']}")
        fields["n_head"] = fields["d_model"] // head_size
    return ModelConfig(**fields)


def ddl_extra_params(cfg: ModelConfig) -> int:
    """Parameters a DDL config adds over the same-size baseline (analytic; tested against GPT)."""
    if cfg.residual == "baseline":
        return 0
    d, dv = cfg.d_model, cfg.dv
    gate = d + 1 if cfg.beta_estimator == "linear" else d * cfg.beta_hidden + cfg.beta_hidden + 1
    further_steps = (cfg.n_h - 1) * (d * d + gate + d * dv + dv)      # W_k^j, gate and value map of steps j >= 2
    per_delta = gate + d * dv + dv + (d * d if cfg.mapping == "v" else 0) + further_steps
    compressor = (d if cfg.channel_conv else d * dv) * cfg.state_kernel + dv if cfg.expanded else 0
    expander = d * dv * cfg.embed_conv_kernel if cfg.expanded and cfg.embed_conv else 0
    return cfg.n_layer * (2 * per_delta + compressor) + (compressor + expander)


def param_count(cfg: ModelConfig) -> int:
    """GPT(cfg).num_params() without building it (no torch): dry runs and planning use this."""
    d, hidden = cfg.d_model, (8 * cfg.d_model) // 3
    block = 4 * d * d + 3 * d * hidden + 2 * d + 2 * cfg.head_dim   # attention, SwiGLU, 2 norms, QK norms
    return cfg.vocab_size * d + cfg.n_layer * block + d + ddl_extra_params(cfg)


def non_embedding_params(cfg: ModelConfig) -> int:
    """N of the scaling laws (Kaplan et al. 2020): every parameter but the tied token embedding."""
    return param_count(cfg) - cfg.vocab_size * cfg.d_model


def backbone_params(cfg: ModelConfig) -> int:
    """The baseline's N at cfg's size: the same for every row of a size, so a token budget of c * N
    gives every row the baseline's steps (and pairs it with the baseline)."""
    return non_embedding_params(cfg) - ddl_extra_params(cfg)
