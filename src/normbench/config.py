"""Structured config schema (Hydra ConfigStore), the typed config and its validation.

The schema is registered as the top-level ``normbench_schema`` (not inside any
config group, so ``arch=glob(*)`` sweeps never pick it up). ``conf/config.yaml``
lists it first in its defaults; every group file then merges into a typed,
struct-mode node, so a wrong type or an unknown key fails at composition.
:func:`validate` adds the checks a type system cannot express (positive
learning rate, ``d_model % n_head``, ...) and raises :class:`ConfigError`
with one line naming the key and what is allowed. :func:`to_config` turns the composed
config into the typed :class:`Config` (``OmegaConf.to_object``) and validates it, once: the
trainer and everything below it receive that object.

Adding a key: one dataclass field below (with its default and a comment) and, if it has limits,
one line in :func:`validate` (``_choice`` / ``_positive`` / a range check); conf/ files set it per
group, and docs/contract.md lists it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from normbench.errors import ConfigError, DataError


def archs() -> tuple[str, ...]:
    """``arch=`` names: the block placements (model/placement.py's registry), then nGPT (its own model)."""
    from normbench.model.placement import PLACEMENTS

    return (*PLACEMENTS, "ngpt")


def norms() -> tuple[str, ...]:
    """``norm=`` names: model/norms.py's registry (model/__init__ imports the modules that register)."""
    import normbench.model  # noqa: F401
    from normbench.model.norms import NORMS as registry

    return tuple(registry)


def optims() -> tuple[str, ...]:
    """``optim=`` names: optim.py's registry."""
    from normbench.optim import OPTIMIZERS

    return tuple(OPTIMIZERS)


def __getattr__(name: str):  # ARCHS, NORMS, OPTIMS: read from the registries when asked
    lists = {"ARCHS": archs, "NORMS": norms, "OPTIMS": optims}
    if name in lists:
        return lists[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from normbench import stabilizers  # noqa: E402  (after the registry readers above)

ATTN_GATES = ("none", "headwise", "elementwise")
SCHEDS = ("cosine", "wsd", "constant")
DATAS = ("kjv", "files", "hf", "synthetic")
TOKENIZERS = ("byte", "bpe", "gpt2")
POS = ("rope", "learned")
MLPS = ("swiglu", "gelu", "relu")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16")
PARALLELS = ("none", "ddp", "fsdp")
DIAGS = ("off", "default", "full")
QK_NORMS = ("none", "head", "width")


def qk_norm_mode(value: Any) -> str:
    """``arch.qk_norm`` as one of :data:`QK_NORMS`; the old boolean form reads true -> head, false -> none.

    Old configs (and old runs' saved configs and checkpoints) hold a bool; through the typed
    schema it arrives as the string ``True``/``False``.
    """
    text = str(value).lower()
    return {"true": "head", "false": "none"}.get(text, text)


@dataclass
class ModelConfig:
    name: str = "tiny"
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    d_ff: int | None = None  # None: 4*d (gelu/relu), 8/3*d rounded up to 32 (swiglu)
    seq_len: int = 128
    vocab_size: int | None = None  # None: from the tokenizer
    pad_vocab_to: int = 64  # embedding rows rounded up (nanoGPT's 50257 -> 50304)
    pos: str = "rope"
    rope_theta: float = 10000.0
    mlp: str = "swiglu"
    bias: bool = False
    tie_embeddings: bool = True
    init_std: float = 0.02
    dropout: float = 0.0
    fixnorm: bool = False  # unit-L2 word embeddings x sqrt(d); a tied head uses them too (Nguyen & Salazar 2019)


@dataclass
class ArchConfig:
    name: str = "pre_ln"
    final_norm: bool = True  # norm before the LM head (post_ln: switch; deepnorm/ngpt: none)
    embed_norm: bool = False  # peri_ln: optional norm on the embedding output
    post_ratio: float = 0.25  # mix_ln: first floor(post_ratio * L) blocks are Post-LN
    alpha: float | None = None  # deepnorm residual scale; None -> (2L)^(1/4)
    beta: float | None = None  # deepnorm init gain; None -> (8L)^(-1/4)
    qk_norm: str = "none"  # none | head (per-head, over d_h) | width (OLMo 2: over all of q, k); before RoPE
    scaled_init: bool = True  # output projections std/sqrt(2L) (GPT-2/nanoGPT)
    small_init: bool = False  # hybridnorm: std = sqrt(2/(5d)) (Megatron "small init")
    embed_init_std: float | None = None  # None -> the model's init std
    # nGPT (NVIDIA/ngpt): eigen learning rates and scalings, "stored value x (init/scale)"
    alpha_init: float = 0.05
    s_qk_init: float = 1.0
    s_uv_init: float = 1.0
    s_z_init: float = 1.0
    norm_eps: float = 1e-6  # eps of nGPT's L2 normalisations
    # model/more_placements.py (docs/architectures.md §3.9 to §3.14)
    attn_gate: str = "none"  # none | headwise | elementwise: sigmoid gate before the out-projection (any softmax arch)
    scale_resids: bool = False  # normformer: learned lambda (init 1) on the FFN residual
    gain_offset: bool = False  # sandwich: norm gains stored as 1 + w, w init 0 (Gemma)
    dssn_c_attn: float | None = None  # sandwich_depth: attention output-norm gain init c / sqrt(L)
    dssn_c_mlp: float | None = None  # sandwich_depth: MLP output-norm gain init c / sqrt(L)
    tiny_init: bool = False  # Pangu Ultra TinyInit: weights N(0, 1/(2 d L)) (variance), embedding std 0.5


@dataclass
class NormConfig:
    name: str = "rmsnorm"
    eps: float = 1e-6
    affine: bool = True  # false: no gain vector (the "no scale" ablation)
    bias: bool = False  # layernorm / dyt / derf additive bias
    alpha_init_attn: float | None = None  # dyt/derf: initial scalar alpha per site; None: width rule
    alpha_init_ffn: float | None = None  # (model/norms.py alpha_rule)
    alpha_init_final: float | None = None
    shift_init: float = 0.0  # derf: initial scalar shift
    embed_scale: bool = False  # dyt/derf: learnable embedding scalar, init sqrt(d)
    width_init: bool = False  # dyt/derf/none: weights and embedding N(0, 1/d_model), not model.init_std
    # model/more_norms.py (docs/architectures.md §2)
    seed_heads: int = 1  # seednorm: slices with their own seed <x_i, beta_i> (the paper's multi-head form)
    seed_alpha_init: float = 1.0  # seednorm: alpha init (gamma = 1, beta = 0)
    seed_final: bool = False  # seednorm: also the final norm (false: RMSNorm there; docs/architectures.md §2)
    bn_momentum: float = 0.05  # batchnorm: running-stat momentum (the PowerNorm repo's BN baseline)
    pn_alpha_fwd: float = 0.9  # powernorm: EMA of the running quadratic mean phi
    pn_alpha_bkw: float = 0.9  # powernorm: EMA factor of the approximate backward
    pn_groups: int = 1  # powernorm: groups of the per-token group scaling (reference NormSelect: n_head)
    pn_warmup: int = 0  # powernorm: steps on batch statistics first (leaks the future; needs allow_leak)
    allow_leak: bool = False  # batchnorm / powernorm warmup: train with statistics over future positions


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    momentum: float = 0.9  # sgd / muon
    nesterov: bool = True  # sgd / muon
    fused: bool | None = None  # adamw: None -> fused on CUDA, foreach elsewhere
    adamw_lr: float | None = None  # muon: lr of the AdamW side (None -> lr)
    ns_steps: int = 5  # muon Newton-Schulz iterations
    # weight-decay policy: which parameter kinds are decayed (2-D hidden matrices always are)
    decay_norm_in: bool = False
    decay_norm_out: bool = False
    decay_bias: bool = False
    decay_embed: bool = False
    decay_scalars: bool = False
    qk_clip: bool = False  # QK-Clip after each step (Kimi K2 MuonClip; normbench/stabilizers.py)
    qk_clip_tau: float = 100.0  # the max pre-softmax logit a head may reach


@dataclass
class SchedConfig:
    name: str = "cosine"
    warmup_steps: int | None = None  # None: 10% of the run (the Mix-LN recipe); 0: no warmup
    min_lr_ratio: float = 0.1  # cosine/wsd end at lr * min_lr_ratio
    decay_fraction: float = 0.2  # wsd: last fraction of steps decays


@dataclass
class DataConfig:
    name: str = "kjv"
    tokenizer: str = "byte"
    vocab_size: int | None = None  # bpe: target size (default 4096); byte 256; gpt2 50257
    paths: list[str] = field(default_factory=list)  # data=files
    hf_path: str | None = None  # data=hf: hub name or local path for datasets.load_dataset
    hf_config: str | None = None
    hf_split: str = "train"
    hf_text_field: str = "text"
    val_fraction: float = 0.05
    synthetic_tokens: int = 300_000  # data=synthetic: characters of generated text
    cache_dir: str | None = None  # None -> $NORMBENCH_CACHE or ~/.cache/normbench


@dataclass
class TrainerConfig:
    batch_size: int = 16
    grad_accum: int = 1
    max_steps: int = 200
    max_tokens: int | None = None  # if set, stop at whichever of the two comes first
    grad_clip: float = 1.0  # 0 disables clipping
    log_every: int = 10
    eval_every: int = 50
    eval_batches: int = 8
    ckpt_every: int = 100
    resume: bool = False
    resume_allow_changed: list[str] = field(default_factory=list)  # non-model keys allowed to differ
    diverge_factor: float = 3.0  # loss > factor * the first step's loss -> diverged
    skip_nonfinite: bool = False  # skip optimizer steps whose gradients are NaN/inf
    max_skipped: int = 10  # more skipped steps than this (in total) -> diverged
    stop_grace_s: float = 30.0  # after a stop signal, exit at once if no safe point came within this (signals.py)
    skip_memory_check: bool = False  # true: train even when the memory estimate exceeds the device (memory.py)


@dataclass
class DiagConfig:
    name: str = "default"
    every: int = 50
    batch: int = 2  # sequences in the fixed held-out diagnostic batch
    spike_factor: float = 1.5  # loss > factor * running median -> spike
    spike_window: int = 50


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str = "normbench"
    entity: str | None = None
    group: str | None = None  # None -> the sweep directory name
    tags: list[str] = field(default_factory=list)
    job_type: str = "train"
    mode: str | None = None  # online | offline | disabled; None -> WANDB_MODE or online


@dataclass
class LoggerConfig:
    name: str = "jsonl"
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    arch: ArchConfig = field(default_factory=ArchConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    diag: DiagConfig = field(default_factory=DiagConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    compile: Any = False  # true, false or "auto" (normbench/compiling.py)
    parallel: str = "none"
    peak_flops: float | None = None  # for MFU; None -> known value for the GPU, if any


def to_config(cfg: Any) -> Config:
    """The composed config as a validated :class:`Config` (ConfigError, one line, if it is not valid)."""
    if not isinstance(cfg, Config):
        if not (isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is Config):
            cfg = OmegaConf.merge(OmegaConf.structured(Config), cfg)  # a plain mapping: the schema first
        cfg = OmegaConf.to_object(cfg)
    validate(cfg)
    return cfg


def as_dict(node: Any) -> dict:
    """A config section (typed or OmegaConf) as plain nested dicts and lists."""
    if dataclasses.is_dataclass(node):
        return dataclasses.asdict(node)
    return OmegaConf.to_container(node, resolve=True)


def register_configs() -> None:
    ConfigStore.instance().store(name="normbench_schema", node=Config)


def _choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _positive(key: str, value: Any, zero_ok: bool = False) -> None:
    if value is None:
        return
    if value != value or value < 0 or (value == 0 and not zero_ok):  # value != value: NaN
        raise ConfigError(f"{key}={value} must be {'>= 0' if zero_ok else '> 0'}")


LEAK = (
    "lets each token see later positions through batch statistics over batch x time "
    "(docs/architectures.md §2); set norm.allow_leak=true to train with it anyway"
)


def _check_more_norms(n: Any, m: Any, a: Any) -> None:
    """Keys of the norms in model/more_norms.py (ConfigError, one line)."""
    if n.name == "batchnorm" and not n.allow_leak:
        raise ConfigError(f"norm=batchnorm {LEAK}")
    if n.name == "powernorm" and n.pn_warmup > 0 and not n.allow_leak:
        raise ConfigError(f"norm.pn_warmup={n.pn_warmup} {LEAK}; the causal-safe powernorm has pn_warmup=0")
    qk = qk_norm_mode(a.qk_norm)
    if n.name in ("batchnorm", "powernorm") and qk != "none":
        raise ConfigError(f"arch.qk_norm={qk} with norm={n.name}: batch-statistic norms replace the block norms only")
    if n.name == "crmsnorm" and (qk != "none" or a.name in ("hybridnorm", "hybridnorm_star")):
        raise ConfigError(
            f"norm=crmsnorm with {f'arch.qk_norm={qk}' if qk != 'none' else f'arch={a.name}'}: CRMSNorm reads its "
            "input as a compressed zero-mean residual, which q/k/v are not; allowed: arch.qk_norm=none, not hybridnorm*"
        )
    if n.name == "seednorm" and not n.affine:
        raise ConfigError("norm.affine=false with norm=seednorm: gamma, alpha, beta are the method; allowed: true")
    for key in ("seed_heads", "pn_groups"):
        _positive(f"norm.{key}", getattr(n, key))
    _positive("norm.pn_warmup", n.pn_warmup, zero_ok=True)
    for key in ("bn_momentum", "pn_alpha_fwd", "pn_alpha_bkw"):
        if not 0.0 <= getattr(n, key) <= 1.0:
            raise ConfigError(f"norm.{key}={getattr(n, key)} must be in [0, 1]")
    if n.name == "seednorm":
        widths = [m.d_model] + ([m.d_model // m.n_head] if qk == "head" else [])
        if any(w % n.seed_heads for w in widths):
            raise ConfigError(f"norm.seed_heads={n.seed_heads} must divide the normalized widths {widths}")
    if n.name == "powernorm" and m.d_model % n.pn_groups:
        raise ConfigError(f"norm.pn_groups={n.pn_groups} must divide model.d_model={m.d_model}")


def run_steps(cfg: Any) -> int:
    """Optimizer steps the run takes: ``trainer.max_steps``, or fewer when ``trainer.max_tokens``
    (at ``batch_size x grad_accum x seq_len`` tokens per step) comes first."""
    t = cfg.trainer
    if not t.max_tokens:
        return t.max_steps
    return min(t.max_steps, max(1, t.max_tokens // (t.batch_size * t.grad_accum * cfg.model.seq_len)))


def check_data(d: Any) -> None:
    """The ``data.*`` keys (DataError, one line). Part of :func:`validate`; data.load_data runs it too,
    for callers that hand it a data section alone. ``val_fraction`` is in (0, 0.5): the split is cut
    at a line boundary within 0.5x-1.5x of it (data.split_text), so the training part stays the larger."""
    get = lambda key: getattr(d, key, getattr(DataConfig, key, None))  # noqa: E731 (any object, defaults)
    name, tokenizer, vocab_size = get("name"), get("tokenizer"), get("vocab_size")
    for key, value, allowed in (("data.name", name, DATAS), ("data.tokenizer", tokenizer, TOKENIZERS)):
        if value not in allowed:
            raise DataError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")
    val_fraction = get("val_fraction")
    if not 0.0 < val_fraction < 0.5:
        raise DataError(f"data.val_fraction={val_fraction} must be in (0, 0.5)")
    if vocab_size is not None:
        if vocab_size <= 0:
            raise DataError(f"data.vocab_size={vocab_size} must be > 0")
        fixed = {"byte": 256, "gpt2": 50257}.get(tokenizer)
        if fixed is not None and vocab_size != fixed:
            raise DataError(f"data.vocab_size={vocab_size} does not fit data.tokenizer={tokenizer} ({fixed})")
        if tokenizer == "bpe" and vocab_size < 257:
            raise DataError(f"data.vocab_size={vocab_size} must be >= 257 for data.tokenizer=bpe")
    if name == "files" and not get("paths"):
        raise DataError("data.paths is empty; data=files needs data.paths=[file1.txt,...]")
    if name == "hf" and not get("hf_path"):
        raise DataError("data.hf_path is not set; data=hf needs data.hf_path=<hub name or local path>")
    if name == "synthetic" and get("synthetic_tokens") < 100:
        raise DataError(f"data.synthetic_tokens={get('synthetic_tokens')} must be >= 100")


def validate(cfg: Any) -> None:
    """Semantic checks that the schema's types cannot express; raises ConfigError."""
    m, a, n, o, s, d, t = cfg.model, cfg.arch, cfg.norm, cfg.optim, cfg.sched, cfg.data, cfg.trainer
    _choice("arch.name", a.name, archs())
    _choice("norm.name", n.name, norms())
    _choice("optim.name", o.name, optims())
    _choice("arch.qk_norm", qk_norm_mode(a.qk_norm), QK_NORMS)  # true/false: the old boolean form
    _choice("arch.attn_gate", a.attn_gate, ATTN_GATES)
    _positive("arch.dssn_c_attn", a.dssn_c_attn)
    _positive("arch.dssn_c_mlp", a.dssn_c_mlp)
    _choice("sched.name", s.name, SCHEDS)
    _choice("model.pos", m.pos, POS)
    _choice("model.mlp", m.mlp, MLPS)
    _choice("device", cfg.device, DEVICES)
    _choice("precision", cfg.precision, PRECISIONS)
    if cfg.compile is not True and cfg.compile is not False and cfg.compile != "auto":
        raise ConfigError(f"compile={cfg.compile!r} is not allowed; choose one of: true, false, auto")
    _choice("parallel", cfg.parallel, PARALLELS)
    _choice("diag.name", cfg.diag.name, DIAGS)
    _choice("logger.name", cfg.logger.name, ("jsonl", "wandb"))
    if cfg.logger.wandb.mode is not None:
        _choice("logger.wandb.mode", cfg.logger.wandb.mode, ("online", "offline", "disabled", "shared"))
    for key in ("n_layer", "d_model", "n_head", "seq_len", "d_ff", "pad_vocab_to"):
        _positive(f"model.{key}", getattr(m, key))
    _positive("model.init_std", m.init_std)
    _positive("model.rope_theta", m.rope_theta)
    if m.d_model % m.n_head:
        raise ConfigError(
            f"model.n_head={m.n_head} must divide model.d_model={m.d_model} "
            f"(allowed n_head: {', '.join(str(h) for h in range(1, m.d_model + 1) if m.d_model % h == 0 and h <= 64)})"
        )
    if m.pos == "rope" and (m.d_model // m.n_head) % 2:
        raise ConfigError(f"model.pos=rope needs an even head dim; d_model/n_head = {m.d_model // m.n_head}")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"model.dropout={m.dropout} must be in [0, 1)")
    if not 0.0 <= a.post_ratio <= 1.0:
        raise ConfigError(f"arch.post_ratio={a.post_ratio} must be in [0, 1]")
    _positive("arch.alpha", a.alpha)
    _positive("arch.beta", a.beta)
    _positive("norm.eps", n.eps)
    for site in ("attn", "ffn", "final"):
        _positive(f"norm.alpha_init_{site}", getattr(n, f"alpha_init_{site}"))
    _check_more_norms(n, m, a)
    stabilizers.check_config(cfg)
    _positive("optim.lr", o.lr, zero_ok=True)  # lr 0: a no-training control run (its outcome is stuck)
    _positive("optim.eps", o.eps, zero_ok=True)
    _positive("optim.ns_steps", o.ns_steps)
    if not 0.0 <= o.momentum < 1.0:
        raise ConfigError(f"optim.momentum={o.momentum} must be in [0, 1)")
    _positive("arch.norm_eps", a.norm_eps)
    _positive("trainer.max_skipped", t.max_skipped, zero_ok=True)
    _positive("optim.weight_decay", o.weight_decay, zero_ok=True)
    _positive("optim.adamw_lr", o.adamw_lr)
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError(f"optim.betas={list(o.betas)} must be two numbers in [0, 1)")
    _positive("sched.warmup_steps", s.warmup_steps, zero_ok=True)
    if not 0.0 <= s.min_lr_ratio <= 1.0:
        raise ConfigError(f"sched.min_lr_ratio={s.min_lr_ratio} must be in [0, 1]")
    if not 0.0 <= s.decay_fraction <= 1.0:
        raise ConfigError(f"sched.decay_fraction={s.decay_fraction} must be in [0, 1]")
    for key in ("batch_size", "grad_accum", "max_steps", "log_every", "eval_every", "eval_batches", "ckpt_every"):
        _positive(f"trainer.{key}", getattr(t, key))
    _positive("trainer.max_tokens", t.max_tokens)
    _positive("trainer.grad_clip", t.grad_clip, zero_ok=True)
    _positive("trainer.diverge_factor", t.diverge_factor)
    _positive("trainer.stop_grace_s", t.stop_grace_s)
    steps = run_steps(cfg)
    length = f"trainer.max_steps={t.max_steps}"
    if steps < t.max_steps:
        length = f"trainer.max_tokens={t.max_tokens} gives {steps} steps"
    if s.warmup_steps is not None and s.warmup_steps >= steps and s.warmup_steps > 0:
        raise ConfigError(f"sched.warmup_steps={s.warmup_steps} must be shorter than the run ({length})")
    check_data(d)
    _positive("diag.every", cfg.diag.every)
    _positive("diag.batch", cfg.diag.batch)
    _positive("diag.spike_factor", cfg.diag.spike_factor)
    _positive("diag.spike_window", cfg.diag.spike_window)
