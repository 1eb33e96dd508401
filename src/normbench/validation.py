"""The one validation pass of a composed config: what the schema's types in config/schema.py cannot express.

:func:`validate` runs on every config once, in :func:`prepare` / :func:`to_config`: the trainer, the
sweep pre-check of ``normbench train`` (cli/overrides.py, before any work) and every test call it. It
applies the arch's forced values first (config/recipes.py), then refuses a name that no registry holds,
a learning rate below 0, ``d_model % n_head``, a warmup as long as the run, a norm that leaks later
positions, an arch x norm combination that cannot build (model.check_combination), ... Each is a
:class:`ConfigError` (:class:`DataError` for ``data.*``) with one line naming the key and what is
allowed; what passes returns the start-up notes the run logs.

Adding a key with limits: one line in the ``_check_*`` function of its section (``_choice`` / ``_positive`` /
a range check); a norm's key: its keys class's ``check`` (config/norm_keys.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from normbench.config.lr_rule import resolve as resolve_lr
from normbench.config.norm_keys import check_norm_keys, positive
from normbench.config.recipes import apply_recipe
from normbench.config.schema import (
    ATTN_GATES,
    DEVICES,
    DIAGS,
    INIT_RULES,
    MLPS,
    MUP_DECAYS,
    MUP_EPS,
    PARALLELS,
    PARAMS,
    POS,
    PRECISIONS,
    QK_NORMS,
    SCHEDS,
    Config,
    qk_norm_mode,
    schema_node,
)
from normbench.config.spec import RunLength, run_spec
from normbench.data.checks import check_data
from normbench.errors import ConfigError
from normbench.model import GPT, build_model, check_combination, model_class, mup, stabilizers, weight_init_std
from normbench.model.placement import arch_names
from normbench.norm.norm_api import norm_class
from normbench.norm.norms import NORMS as registry
from normbench.optim.optimizers import OPTIMIZERS, build_optimizer, warmup_steps
from normbench.runtime import compiling, length
from normbench.runtime import distributed as dist_utils


def archs() -> tuple[str, ...]:
    """``arch=`` names: the block placements (model/placement.py's registry), then the archs with a model of
    their own (nGPT)."""

    return arch_names()


def norms() -> tuple[str, ...]:
    """``norm=`` names: norm/norms.py's registry (model/__init__ imports the modules that register)."""

    return tuple(registry)


def optims() -> tuple[str, ...]:
    """``optim=`` names: optim.py's registry."""

    return tuple(OPTIMIZERS)


def __getattr__(name: str):  # ARCHS, NORMS, OPTIMS: read from the registries when asked
    lists = {"ARCHS": archs, "NORMS": norms, "OPTIMS": optims}
    if name in lists:
        return lists[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _choice(key: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")


_positive = positive  # config/norm_keys.py: > 0 (>= 0 with zero_ok), None passes


def validate(cfg: Any) -> list[str]:
    """The one validation pass of a composed config: ConfigError (one line) or the start-up notes.

    First the values the arch forces (config/recipes.py: nGPT's warmup and weight decay) are set in
    ``cfg``, so nothing is refused that the run would ignore; then every key's limits, the chosen norm's
    own checks and the arch x norm combinations (model.check_combination), the QK-Clip, parallel and
    data checks. What needs this machine (device, world size, memory, the data's size) is checked when
    the run is built (train/build.py)."""

    notes = apply_recipe(cfg)
    _check_names(cfg)
    _check_model(cfg.model, cfg.arch)
    _check_norm(cfg)
    stabilizers.check_config(cfg)
    _check_optim(cfg.optim, cfg.arch, cfg.model)
    _check_schedule(cfg)
    check_data(cfg.data)
    for key in ("every", "batch", "spike_factor", "spike_window"):
        _positive(f"diag.{key}", getattr(cfg.diag, key))
    notes += check_combination(cfg)
    notes += mup.check(cfg, own_model=model_class(cfg) is not GPT)  # model.param: what muP covers (model/mup.py)
    _check_eval(cfg.eval, cfg.trainer)
    _check_length(cfg)  # after the model's checks: tokens_per_param builds the model (on the meta device)
    dist_utils.check_config(cfg)  # e.g. optimizers that FSDP2 shards cannot run
    return notes


def _check_eval(e: Any, t: Any) -> None:
    """In-training downstream evaluation (downstream/callback.py): at validation steps, the last one always."""
    _positive("eval.every", e.every, zero_ok=True)
    _positive("eval.batch_size", e.batch_size)
    _positive("eval.limit", e.limit)
    if e.tasks and e.every and e.every % t.eval_every:
        raise ConfigError(
            f"eval.every={e.every} must be a multiple of trainer.eval_every={t.eval_every} (or 0: the last step)"
        )


def _check_names(cfg: Any) -> None:
    """Every key whose value names a registered option or a fixed choice."""
    a = cfg.arch
    _choice("arch.name", a.name, archs())
    _choice("norm.name", cfg.norm.name, norms())
    _choice("optim.name", cfg.optim.name, optims())
    _choice("arch.qk_norm", qk_norm_mode(a.qk_norm), QK_NORMS)  # true/false: the old boolean form
    _choice("arch.attn_gate", a.attn_gate, ATTN_GATES)
    _positive("arch.dssn_c_attn", a.dssn_c_attn)
    _positive("arch.dssn_c_mlp", a.dssn_c_mlp)
    _choice("sched.name", cfg.sched.name, SCHEDS)
    _choice("model.pos", cfg.model.pos, POS)
    _choice("model.mlp", cfg.model.mlp, MLPS)
    _choice("model.param", cfg.model.param, PARAMS)
    _choice("optim.mup_decay", cfg.optim.mup_decay, MUP_DECAYS)
    _choice("optim.mup_eps", cfg.optim.mup_eps, MUP_EPS)
    _choice("device", cfg.device, DEVICES)
    _choice("precision", cfg.precision, PRECISIONS)
    if cfg.compile is not True and cfg.compile is not False and cfg.compile != "auto":
        raise ConfigError(f"compile={cfg.compile!r} is not allowed; choose one of: true, false, auto")
    _choice("parallel", cfg.parallel, PARALLELS)
    _choice("diag.name", cfg.diag.name, DIAGS)
    _choice("logger.name", cfg.logger.name, ("jsonl", "wandb"))
    if cfg.logger.wandb.mode is not None:
        _choice("logger.wandb.mode", cfg.logger.wandb.mode, ("online", "offline", "disabled", "shared"))


def _check_model(m: Any, a: Any) -> None:
    """``model.*`` and the arch's numbers."""
    for key in (
        "n_layer",
        "d_model",
        "n_head",
        "seq_len",
        "d_ff",
        "pad_vocab_to",
        "mup_base_width",
        "mup_base_depth",
        "mup_head_dim",
    ):
        _positive(f"model.{key}", getattr(m, key))
    number = isinstance(m.init_std, (int, float)) and not isinstance(m.init_std, bool)
    if m.init_std not in INIT_RULES and not (number and m.init_std > 0):
        raise ConfigError(f"model.init_std={m.init_std} is not allowed; choose auto, fan_in or a number > 0")
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


def _check_norm(cfg: Any) -> None:
    """``norm.*``: a leak the config does not allow, each keys class's limits, the norm class's own checks."""

    n = cfg.norm
    cls = norm_class(n.name)
    if cls.leaks(n) and not n.allow_leak:
        raise ConfigError(cls.leak_refusal(n))
    check_norm_keys(n)
    cls.check(cfg)


def _check_optim(o: Any, a: Any, m: Any) -> None:
    # auto: refused where no rule carries it (config/lr_rule.py); lr 0: a no-training control run (stuck)
    _positive("optim.lr", resolve_lr(o, m), zero_ok=True)
    _positive("optim.eps", o.eps, zero_ok=True)
    _positive("optim.ns_steps", o.ns_steps)
    if not 0.0 <= o.momentum < 1.0:
        raise ConfigError(f"optim.momentum={o.momentum} must be in [0, 1)")
    _positive("arch.norm_eps", a.norm_eps)
    _positive("optim.weight_decay", o.weight_decay, zero_ok=True)
    _positive("optim.adamw_lr", o.adamw_lr)
    if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
        raise ConfigError(f"optim.betas={list(o.betas)} must be two numbers in [0, 1)")


def _check_schedule(cfg: Any) -> None:
    """``sched.*`` and ``trainer.*``: the run's length, and a warmup shorter than it."""
    s, t = cfg.sched, cfg.trainer
    _positive("trainer.max_skipped", t.max_skipped, zero_ok=True)
    _positive("sched.warmup_steps", s.warmup_steps, zero_ok=True)
    if not 0.0 <= s.min_lr_ratio <= 1.0:
        raise ConfigError(f"sched.min_lr_ratio={s.min_lr_ratio} must be in [0, 1]")
    if not 0.0 <= s.decay_fraction <= 1.0:
        raise ConfigError(f"sched.decay_fraction={s.decay_fraction} must be in [0, 1]")
    for key in ("batch_size", "grad_accum", "max_steps", "log_every", "eval_every", "eval_batches", "ckpt_every"):
        _positive(f"trainer.{key}", getattr(t, key))
    _positive("trainer.max_tokens", t.max_tokens)
    _positive("trainer.ckpt_every_s", t.ckpt_every_s, zero_ok=True)
    _positive("trainer.grad_clip", t.grad_clip, zero_ok=True)
    _positive("trainer.diverge_factor", t.diverge_factor)
    _positive("trainer.stop_grace_s", t.stop_grace_s)
    length.check_ratio(t.tokens_per_param)


def run_length(cfg: Any, n: int) -> RunLength:
    """The run's length, warmup and init std: the spec's values that need the model (config/spec.RunLength), for
    N = ``n`` (:func:`prepare` counts it on the meta device at the config's vocabulary; the build checks it
    against the model it trains, train/build.py)."""
    steps = length.run_steps(cfg, n=n)
    return RunLength(
        max_steps=steps,
        length_params=n,
        warmup_steps=warmup_steps(cfg.sched, steps),
        init_std=weight_init_std(cfg),
        source=length.describe(cfg, steps, n),
    )


def _check_length(cfg: Any) -> None:
    """The run's length (runtime/length.py) and a warmup shorter than it."""
    s, t = cfg.sched, cfg.trainer
    steps = length.run_steps(cfg)
    what = f"trainer.max_steps={t.max_steps}"
    if t.tokens_per_param is not None:
        what = f"trainer.tokens_per_param={t.tokens_per_param:g} gives {steps} steps"
    elif steps < t.max_steps:
        what = f"trainer.max_tokens={t.max_tokens} gives {steps} steps"
    if s.warmup_steps is not None and s.warmup_steps >= steps and s.warmup_steps > 0:
        raise ConfigError(f"sched.warmup_steps={s.warmup_steps} must be shorter than the run ({what})")
    bad = [k for k in t.save_at if not (isinstance(k, int) and 0 < k < steps)]
    if bad:
        raise ConfigError(f"trainer.save_at={list(t.save_at)}: {bad[0]} is not a step inside the run (1..{steps - 1})")


def prepare(cfg: Any) -> tuple[Config, list[str]]:
    """The composed config as a typed, validated :class:`Config` (the arch's recipe applied, ``cfg.spec`` its
    resolved spec: config/spec.py) and its start-up notes; ConfigError (one line) if it is not valid."""
    if not isinstance(cfg, Config):
        if not (isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is Config):
            cfg = OmegaConf.merge(OmegaConf.structured(schema_node()), cfg)  # a plain mapping: the schema first
        cfg = OmegaConf.to_object(cfg)
    notes = validate(cfg)
    cfg.spec = run_spec(cfg, compiling.estimate_for_run)  # after validate: the arch's recipe may set keys it reads
    with torch.device("meta"):  # the model's shape, no memory: N and each kind's LR
        model = build_model(cfg, length.config_vocab(cfg))
    cfg.spec = dataclasses.replace(
        cfg.spec,
        length=run_length(cfg, length.count_matrices(model)),
        kind_lrs=build_optimizer(model, cfg, log=lambda _line: None).kind_lrs,
    )
    return cfg, notes


def to_config(cfg: Any) -> Config:
    """The composed config as a validated :class:`Config` (:func:`prepare` without the notes)."""
    return prepare(cfg)[0]
