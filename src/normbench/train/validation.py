"""The semantic checks of a composed config: what the schema's types in config/schema.py cannot express.

:func:`validate` runs on every config once, in :func:`to_config` (and so in ``normbench train``'s
check of its overrides, before any work): a name that no registry holds, a learning rate below 0,
``d_model % n_head``, a warmup as long as the run, a norm whose batch statistics leak later
positions, ... Each is a :class:`ConfigError` (:class:`DataError` for ``data.*``) with one line
naming the key and what is allowed.

Adding a key with limits: one line in :func:`validate` (``_choice`` / ``_positive`` / a range check).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from normbench.config.schema import (
    ATTN_GATES,
    DEVICES,
    DIAGS,
    INIT_RULES,
    MLPS,
    PARALLELS,
    POS,
    PRECISIONS,
    QK_NORMS,
    SCHEDS,
    Config,
    qk_norm_mode,
    run_steps,
)
from normbench.data.checks import check_data
from normbench.errors import ConfigError
from normbench.model import stabilizers


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
    from normbench.train.optim import OPTIMIZERS

    return tuple(OPTIMIZERS)


def __getattr__(name: str):  # ARCHS, NORMS, OPTIMS: read from the registries when asked
    lists = {"ARCHS": archs, "NORMS": norms, "OPTIMS": optims}
    if name in lists:
        return lists[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def _check_scale_and_batch_norms(n: Any, m: Any, a: Any) -> None:
    """Keys of the norms in model/scale_and_batch_norms.py (ConfigError, one line)."""
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
    _positive("norm.eps", n.eps)
    for site in ("attn", "ffn", "final"):
        _positive(f"norm.alpha_init_{site}", getattr(n, f"alpha_init_{site}"))
    _check_scale_and_batch_norms(n, m, a)
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


def to_config(cfg: Any) -> Config:
    """The composed config as a validated :class:`Config` (ConfigError, one line, if it is not valid)."""
    if not isinstance(cfg, Config):
        if not (isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is Config):
            cfg = OmegaConf.merge(OmegaConf.structured(Config), cfg)  # a plain mapping: the schema first
        cfg = OmegaConf.to_object(cfg)
    validate(cfg)
    return cfg
