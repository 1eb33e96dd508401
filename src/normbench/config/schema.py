"""Structured config schema (Hydra ConfigStore) and the typed config.

The schema is registered as the top-level ``normbench_schema`` (not inside any
config group, so ``arch=glob(*)`` sweeps never pick it up). ``conf/config.yaml``
lists it first in its defaults; every group file then merges into a typed,
struct-mode node, so a wrong type or an unknown key fails at composition.
``normbench.validation.validate`` adds the checks a type system cannot express (positive
learning rate, ``d_model % n_head``, ...) and raises :class:`ConfigError`
with one line naming the key and what is allowed. ``normbench.validation.to_config`` turns the composed
config into the typed :class:`Config` (``OmegaConf.to_object``) and validates it, once: the
trainer and everything below it receive that object. Of normbench this module imports only
config/norm_keys.py (the ``norm.*`` keys, a small dataclass per owner) and errors.py: every other
package reads it.

**One value for each default.** The schema holds the types. A key that conf/config.yaml sets (``seed``,
``precision``, ``trainer.max_steps``, ...) has no value here (:data:`SET_BY_YAML`, omegaconf's ``???``): the yaml
is its only home. A group key's default here is the value of the group's default option (``model=small``,
``optim=adamw``, ...), so the schema and the composed config cannot disagree (issue 54: five keys did), and a
group option, a user's overlay included, sets only what it changes. tests/test_config_defaults.py composes every
option of every group and checks both.

Adding a key: one dataclass field below (its default, or :data:`SET_BY_YAML` if conf/config.yaml sets it, and a
comment) and, if it has limits, one line in ``normbench.validation.validate`` (``_choice`` / ``_positive`` /
a range check); a norm's key goes into its owner's dataclass in config/norm_keys.py (with its check).
docs/contract.md lists it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING as SET_BY_YAML
from omegaconf import OmegaConf

from normbench.config.lr_rule import LR_REF, LR_REF_WIDTH
from normbench.config.norm_keys import (
    PLUGIN_KEYS,
    BatchNormKeys,
    LeakKeys,
    NormKeys,
    PointwiseKeys,
    PowerNormKeys,
    SeeDNormKeys,
)

ATTN_GATES = ("none", "headwise", "elementwise")
SCHEDS = ("cosine", "wsd", "constant")
DATAS = ("kjv", "files", "hf", "synthetic", "shards", "mix")
TOKENIZERS = ("byte", "bpe", "gpt2", "tiktoken:NAME", "hf:NAME_OR_PATH")
POS = ("rope", "learned")
MLPS = ("swiglu", "gelu", "relu")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PARALLELS = ("none", "ddp", "fsdp")
DIAGS = ("off", "default", "full")
QK_NORMS = ("none", "head", "width")
PARAMS = ("sp", "mup", "completep")
MUP_DECAYS = ("width", "coupled", "none")
MUP_EPS = ("fixed", "width")


def qk_norm_mode(value: Any) -> str:
    """``arch.qk_norm`` as one of :data:`QK_NORMS`; the old boolean form reads true -> head, false -> none.

    Old configs (and old runs' saved configs and checkpoints) hold a bool; through the typed
    schema it arrives as the string ``True``/``False``.
    """
    text = str(value).lower()
    return {"true": "head", "false": "none"}.get(text, text)


@dataclass
class ModelConfig:
    name: str = "small"  # the defaults of conf/config.yaml's model=small (one value per key: config/schema.py)
    n_layer: int = 4
    d_model: int = 128
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
    init_std: Any = "auto"  # auto: GPT-2's gain at this width; fan_in: d^-0.5; a number: that std (init_std_of)
    dropout: float = 0.0
    fixnorm: bool = False  # unit-L2 word embeddings x sqrt(d); a tied head uses them too (Nguyen & Salazar 2019)
    # the parametrization (model/mup.py, docs/mup.md): sp (standard, today's) | mup (width) | completep (width+depth)
    param: str = "sp"
    mup_base_width: int = 64  # mup/completep: d_base, the width the LR was tuned at (model=tiny's)
    mup_base_depth: int = 2  # completep: L_base, the depth the LR was tuned at (model=tiny's)
    mup_head_dim: int = 16  # mup/completep: d_head held on every width (model=tiny's 64 / 4 heads)


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
    # model/norm_sites.py (docs/architectures.md §3.9 to §3.14)
    attn_gate: str = "none"  # none | headwise | elementwise: sigmoid gate before the out-projection (any softmax arch)
    scale_resids: bool = False  # normformer: learned lambda (init 1) on the FFN residual
    gain_offset: bool = False  # sandwich: norm gains stored as 1 + w, w init 0 (Gemma)
    dssn_c_attn: float | None = None  # sandwich_depth: attention output-norm gain init c / sqrt(L)
    dssn_c_mlp: float | None = None  # sandwich_depth: MLP output-norm gain init c / sqrt(L)
    tiny_init: bool = False  # Pangu Ultra TinyInit: weights N(0, 1/(2 d L)) (variance), embedding std 0.5


@dataclass
class NormConfig(LeakKeys, PowerNormKeys, BatchNormKeys, SeeDNormKeys, PointwiseKeys, NormKeys):
    """The ``norm.*`` keys: each owner's small dataclass (config/norm_keys.py), NormKeys' fields first."""


def norm_config_class() -> type:
    """NormConfig with the keys of the norms registered outside the package (norm_keys.register_norm_keys)."""
    if not PLUGIN_KEYS:
        return NormConfig
    name = "NormConfigWith" + "".join(k.__name__ for k in PLUGIN_KEYS)
    cls = globals().get(name)
    if cls is None:  # a module-level name, so the typed config pickles
        cls = dataclasses.make_dataclass(name, [], bases=(*reversed(PLUGIN_KEYS), NormConfig))
        cls.__module__ = __name__
        globals()[name] = cls
    return cls


def schema_node() -> Config:
    """The schema Hydra composes into: :class:`Config` with every registered norm key."""
    return Config(norm=norm_config_class()())


@dataclass
class OptimConfig:
    name: str = "adamw"
    lr: Any = 2e-3  # a number, or auto: lr_ref carried from lr_ref_width to this width (config/lr_rule.py)
    lr_ref: float = LR_REF  # auto's reference recipe: GPT-2 124M's AdamW LR ...
    lr_ref_width: int = LR_REF_WIDTH  # ... at its width (docs/init.md)
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
    mup_decay: str = "width"  # mup: weight decay of the width-scaled matrices: width (lambda*m) | coupled | none
    mup_eps: str = "fixed"  # mup: Adam eps of the width-scaled groups: fixed | width (eps/m)
    qk_clip: bool = False  # QK-Clip after each step (Kimi K2 MuonClip; normbench/model/stabilizers.py)
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
    paths: list[str] = field(default_factory=list)  # data=files: files, directories, globs
    val_paths: list[str] = field(default_factory=list)  # data=files: a given validation set (else held-out docs)
    hf_path: str | None = None  # data=hf: hub name or local path for datasets.load_dataset
    hf_config: str | None = None
    hf_split: str = "train"
    hf_val_split: str | None = None  # data=hf: a given validation split (else held-out docs)
    hf_streaming: bool = False  # data=hf: stream from the hub instead of downloading to the HF cache
    hf_text_field: str = "text"  # the text field of a row (data=hf, and .jsonl/.json/.parquet/.csv files)
    val_fraction: float = 0.05
    synthetic_tokens: int = 300_000  # data=synthetic: characters of generated text
    cache_dir: str | None = None  # None -> $NORMBENCH_CACHE or ~/.cache/normbench
    workers: int | None = None  # tokenizing processes of a prepare; None -> the usable cores
    shard_tokens: int = 100_000_000  # tokens per shard (llm.c's size)
    train: str | None = None  # data=shards: glob of the training shards (llm.c format)
    val: str | None = None  # data=shards: glob of the validation shards
    mix: list[str] = field(default_factory=list)  # data=mix: prepared directories with weights, DIR:WEIGHT


@dataclass
class TrainerConfig:
    batch_size: int = SET_BY_YAML
    grad_accum: int = SET_BY_YAML
    max_steps: int = SET_BY_YAML
    max_tokens: int | None = None  # if set, stop at whichever of the two comes first
    tokens_per_param: float | None = None  # if set, the length: tokens per weight-matrix param (runtime/length.py)
    grad_clip: float = SET_BY_YAML  # 0 disables clipping
    log_every: int = SET_BY_YAML
    eval_every: int = SET_BY_YAML
    eval_batches: int = 8
    ckpt_every: int | None = SET_BY_YAML  # steps between checkpoints; None: by time alone (ckpt_every_s)
    ckpt_every_s: float = SET_BY_YAML  # a checkpoint at the first log step this many seconds after the last; 0: off
    ckpt_async: bool = False  # write checkpoints in the background (train/ckpt_writer.py)
    activation_checkpointing: bool = False  # recompute each block's activations in backward (distributed.py)
    save_at: list[int] = field(default_factory=list)  # steps whose checkpoint is also kept as step_<k>.pt (branches)
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
class EvalConfig:
    """In-training downstream evaluation (downstream/callback.py); off while ``tasks`` is empty."""

    tasks: list[str] = field(default_factory=list)  # lm-eval task names, scored with the model as it trains
    every: int = 0  # a multiple of trainer.eval_every: score at those steps and the last; 0: the last step only
    limit: float | None = None  # documents per task (a fraction below 1), as `normbench eval --limit`
    include_path: str | None = None  # a folder of task YAML files of your own
    batch_size: int = 32


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
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = SET_BY_YAML
    device: str = SET_BY_YAML
    precision: str = SET_BY_YAML
    attn_fp32: bool = SET_BY_YAML  # under precision=bf16/fp16: the attention kernel in fp32 (model/attention.sdpa)
    compile: Any = SET_BY_YAML  # true, false or "auto" (normbench/runtime/compiling.py)
    parallel: str = SET_BY_YAML
    peak_flops: float | None = None  # for MFU; None -> known value for the GPU, if any
    # the resolved spec (config/spec.py: optim.lr=auto as its number, ...), set once by validation.prepare on the
    # config it returns; a class variable, not a key: never composed, saved or compared
    spec: ClassVar[Any] = None


# The width-transferred init (docs/init.md): GPT-2 draws every weight from N(0, 0.02) at width 768, a
# gain of 0.02 * sqrt(768) ~ 0.55 on a unit-variance input. ``model.init_std: auto`` keeps that gain at
# any width (std ~ 1/sqrt(d), as muP does for hidden weights), so a 64-wide miniature starts where the
# reference starts instead of with almost silent blocks; at d_model 768 it is exactly 0.02.
# ``fan_in`` is d^-0.5, a gain of 1: fairseq's (and so Fixup's, T-Fixup's and nGPT's) base std.
INIT_REF_STD, INIT_REF_WIDTH = 0.02, 768
INIT_RULES = ("auto", "fan_in")


def init_std_of(init_std: Any, d_model: int) -> float:
    """The std ``model.init_std`` resolves to at width ``d_model``: auto 0.02 * sqrt(768 / d), fan_in d^-0.5."""
    if init_std == "auto":
        return INIT_REF_STD * (INIT_REF_WIDTH / d_model) ** 0.5
    if init_std == "fan_in":
        return d_model**-0.5
    return float(init_std)


def upgrade_legacy(flat: dict) -> dict:
    """A flat config of an older run in today's keys, computing what that run computed.

    ``norm.width_init: true`` (the DyT/Derf/none special case it replaced) drew every weight and the
    embedding from N(0, d^-0.5): it becomes ``model.init_std = d^-0.5``. With ``arch.small_init`` it
    replaced that init too; no key expresses that today, so the key is kept and such a run cannot resume.
    """
    out = dict(flat)
    width_init = out.get("norm.width_init")
    if width_init is None or (width_init and out.get("arch.small_init")):
        return out
    del out["norm.width_init"]
    if width_init:
        out["model.init_std"] = float(out["model.d_model"]) ** -0.5
    return out


def as_dict(node: Any) -> dict:
    """A config section (typed or OmegaConf) as plain nested dicts and lists."""
    if dataclasses.is_dataclass(node):
        return dataclasses.asdict(node)
    return OmegaConf.to_container(node, resolve=True)


def register_configs() -> None:
    ConfigStore.instance().store(name="normbench_schema", node=schema_node())
