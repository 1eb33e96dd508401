"""The model's part of the one validation pass (normbench.validation.validate): arch x norm combinations.

Each check asks what a norm or an arch declares (norm/norm_api.py, config/arch_traits.py
``ArchTraits``), never a list of names. The values an arch forces (config/recipes.py) are
already applied when these checks run.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from normbench.config.arch_traits import ARCH_TRAITS, arch_traits
from normbench.config.files import config_dir
from normbench.config.schema import qk_norm_mode
from normbench.errors import ConfigError
from normbench.model.simplegpt import SIMPLENORM_NORMS
from normbench.norm.norm_api import gain_norms, norm_class, statistics_free_norms
from normbench.norm.norms import site_alphas


def check_combination(cfg) -> list[str]:
    """Refuse arch x norm combinations that make no sense (ConfigError, one line); return start-up notes.

    Refused: ``norm=none`` with a placement that needs its norms (``needs_norm``); ``arch.qk_norm=head|width``
    with ``norm=none``; ``norm.embed_scale`` with a norm that is not statistics-free (the sqrt(d) embedding
    scalar is part of the DyT/Derf LLM recipe); ``mix_ln`` without its final norm (the paper always applies
    it); ``arch.attn_gate`` with nGPT; ``arch.gain_offset`` and a placement with ``gain_init`` without a gain
    vector; ``arch.tiny_init`` with another init rule (:func:`_check_norm_sites`).
    An arch with a model class of its own (``ArchTraits.model``: nGPT, SimpleGPT, the norm-free nets) runs that
    class's checks (:data:`MODEL_CHECKS`); one that builds no norm layer (``ignores_norm``) skips the norm.* ones.
    Noted, never silent: keys an arch ignores (nGPT ignores ``norm=`` and the model keys it has no use for;
    ``ArchTraits.own_keys``: ``arch.alpha``/``beta`` belong to DeepNorm, ``arch.post_ratio`` to Mix-LN),
    ablations that leave a paper's recipe (Peri-LN without Output-norm gains), and the a0 and init a
    statistics-free norm resolved.
    """
    arch, a, traits = cfg.arch.name, cfg.arch, arch_traits(cfg.arch.name)
    notes = []
    if "alpha" not in traits.own_keys and (a.alpha is not None or a.beta is not None):
        notes.append(f"arch={arch} ignores arch.alpha/arch.beta (DeepNorm's residual scale and init gain)")
    if "post_ratio" not in traits.own_keys and a.post_ratio != 0.25:
        notes.append(f"arch={arch} ignores arch.post_ratio={a.post_ratio} (Mix-LN's share of Post-LN blocks)")
    own_model = MODEL_CHECKS.get(traits.model)
    if own_model is not None:
        notes += own_model(cfg)
    if traits.ignores_norm:  # no norm layer: the norm.* checks below have nothing to check
        return notes
    return notes + _check_placement(cfg) + _check_norm_sites(cfg) + _check_norm(cfg)


def _owners(key: str) -> str:
    """The ``arch=`` names that read ``arch.<key>`` (ArchTraits.own_keys), for the note under any other."""
    return "/".join(name for name, traits in ARCH_TRAITS.items() if key in traits.own_keys)


def _check_ngpt(cfg) -> list[str]:
    """nGPT: its own model, which ignores ``norm=`` and most model keys (noted)."""
    a, m, norm, notes = cfg.arch, cfg.model, cfg.norm.name, []
    if a.attn_gate != "none":
        raise ConfigError(
            f"arch.attn_gate={a.attn_gate} with arch=ngpt: nGPT keeps every matrix on the unit sphere, so the "
            "gate logit x W_g would be a cosine and sigmoid could never close it (nGPT defines no scale for it); "
            "allowed with ngpt: none"
        )
    if not norm_class(norm).identity:
        notes.append(f"arch=ngpt ignores norm={norm}: nGPT normalizes by L2 projection onto the unit sphere")
    if m.tie_embeddings:
        notes.append("arch=ngpt unties embeddings (the reference never ties wte and lm_head)")
    ignored = [
        f"{key}={value}"
        for key, value, default in (
            ("model.pos", m.pos, "rope"),
            ("model.mlp", m.mlp, "swiglu"),
            ("model.bias", m.bias, False),
            ("model.dropout", m.dropout, 0.0),
            ("model.fixnorm", m.fixnorm, False),
            ("arch.qk_norm", a.qk_norm if qk_norm_mode(a.qk_norm) != "none" else False, False),
            ("arch.final_norm", a.final_norm, False),
            ("arch.embed_norm", a.embed_norm, False),
            ("arch.gain_offset", a.gain_offset, False),
            ("arch.tiny_init", a.tiny_init, False),
            ("arch.scale_resids", a.scale_resids, False),
        )
        if value != default
    ]
    if ignored:
        notes.append(
            f"arch=ngpt ignores {', '.join(ignored)}: it always uses RoPE, SwiGLU, no biases, no dropout, "
            "and L2 normalization in place of q/k, final and embedding norms"
        )
    return notes


def _check_placement(cfg) -> list[str]:
    """What the softmax placements (model/placement.py, model/norm_sites.py) need of the config."""
    arch, norm, a, notes = cfg.arch.name, cfg.norm.name, cfg.arch, []
    traits, no_norm = arch_traits(arch), norm_class(norm).identity
    if traits.keeps_final_norm and not a.final_norm:
        raise ConfigError(f"arch.final_norm=false: {arch} {traits.keeps_final_norm}; allowed: true")
    qk = qk_norm_mode(a.qk_norm)
    if traits.qkv_norms and qk != "none":
        notes.append(f"arch={arch} normalizes q, k and v by construction; arch.qk_norm={qk} adds nothing")
    if traits.learned_gains and not cfg.norm.affine:
        notes.append(f"norm.affine=false {traits.learned_gains}")
    if no_norm and traits.needs_norm:
        raise ConfigError(
            f"norm=none with arch={arch} removes every norm the arch places, which is arch=pre_ln norm=none; "
            "allowed with norm=none: pre_ln"
        )
    if no_norm and qk != "none":
        raise ConfigError(
            f"arch.qk_norm={qk} needs a norm layer; norm=none has none (choose layernorm/rmsnorm/dyt/derf)"
        )
    return notes


def _check_norm(cfg) -> list[str]:
    """What the chosen norm's declarations allow: the embedding scalar, its a0 and init notes."""
    norm, notes = cfg.norm.name, []
    cls = norm_class(norm)
    if cfg.norm.embed_scale and not cls.statistics_free:
        owners = statistics_free_norms()
        raise ConfigError(
            f"norm.embed_scale=true belongs to the {'/'.join(norm_class(n).__name__ for n in owners)} recipe; "
            f"norm={norm} has no embedding scalar (set norm.embed_scale=false or choose norm={'/'.join(owners)})"
        )
    if cls.statistics_free:
        d = cfg.model.d_model
        a = site_alphas(cfg.norm, d)
        notes.append(f"norm={norm}: alpha0 attn/ffn/final {a['attn']:g}/{a['ffn']:g}/{a['final']:g} (d_model={d})")
        if cfg.model.init_std == "auto" and not (cfg.arch.small_init or cfg.arch.tiny_init):  # auto is drawn
            notes.append(
                f"norm={norm} at model.init_std=auto starts at GPT-2's gain (0.55); its LLaMA-style references start "
                "near 1.3, and at small widths it learns far better at model.init_std=fan_in (gain 1; docs/init.md)"
            )
    return notes


def _refuse_attn_gate(cfg) -> None:
    """SimpleGPT's and the norm-free nets' blocks build their own attention, without the gate."""
    a = cfg.arch
    if a.attn_gate != "none":
        raise ConfigError(
            f"arch.attn_gate={a.attn_gate} with arch={a.name}: the gate is not built into its own blocks yet; "
            "allowed: none"
        )


def _check_simplenorm(cfg) -> list[str]:
    """``arch=simplenorm`` (SimpleGPT): ConfigError (one line) for what it cannot build, start-up notes for what
    it ignores (docs/contract.md)."""
    norm, a, m, notes = cfg.norm.name, cfg.arch, cfg.model, []
    if norm not in SIMPLENORM_NORMS:
        raise ConfigError(
            f"norm={norm} with arch=simplenorm: SimpleNorm puts a statistic norm after every linear map "
            f"(Ocram7/SimpleGPT offers RMSNorm and LayerNorm); allowed: {', '.join(SIMPLENORM_NORMS)}"
        )
    if m.fixnorm:
        raise ConfigError("model.fixnorm=true with arch=simplenorm: SimpleGPT's embedding is N(0, 1); allowed: false")
    if m.tie_embeddings:
        notes.append("arch=simplenorm unties embeddings (SimpleGPT's head is its own matrix, trunc-normal d^-0.5)")
    if qk_norm_mode(a.qk_norm) != "none":
        notes.append(
            f"arch=simplenorm normalizes q, k and v (whole width) by construction; arch.qk_norm={a.qk_norm} "
            "adds nothing"
        )
    _refuse_attn_gate(cfg)
    if a.small_init:
        notes.append("arch=simplenorm ignores arch.small_init=true: SimpleGPT's init sets every weight")
    return notes


def _check_norm_free(cfg) -> list[str]:
    """The norm-free archs (rezero, fixup, tfixup): ConfigError (one line) for what they cannot build, start-up
    notes for what they ignore (docs/contract.md)."""
    arch, norm, a, m, notes = cfg.arch.name, cfg.norm.name, cfg.arch, cfg.model, []
    if qk_norm_mode(a.qk_norm) != "none":
        raise ConfigError(
            f"arch.qk_norm={a.qk_norm} with arch={arch}: a norm-free net has no norm layer; allowed: none"
        )
    for key in ("final_norm", "embed_norm"):
        if getattr(a, key):
            raise ConfigError(f"arch.{key}=true with arch={arch}: a norm-free net has no norm layer; allowed: false")
    if arch_traits(arch).sets_embed_scale and m.fixnorm:
        raise ConfigError(f"model.fixnorm=true with arch={arch}: it sets its own embedding scale; allowed: false")
    if not norm_class(norm).identity:
        notes.append(f"arch={arch} ignores norm={norm}: it has no norm layer (use norm=none in sweeps)")
    keys = (("arch.small_init", a.small_init, False), ("arch.embed_init_std", a.embed_init_std, None))
    own_init = [f"{k}={v}" for k, v, default in (*keys, ("model.init_std", m.init_std, "auto")) if v != default]
    own_init = [k for k in own_init if k != "model.init_std=fan_in"]  # d^-0.5 is their own base std
    if own_init:
        notes.append(f"arch={arch} ignores {', '.join(own_init)}: its paper's init sets every weight")
    _refuse_attn_gate(cfg)
    return notes


# ArchTraits.model -> the combination checks of an arch's own model class (model.MODEL_CLASSES)
MODEL_CHECKS = {"ngpt": _check_ngpt, "simplegpt": _check_simplenorm, "normfree": _check_norm_free}


def _arch_default(arch: str, key: str):
    """``key`` as conf/arch/<arch>.yaml sets it (None where it does not): what a user did not set themselves."""

    path = config_dir() / "arch" / f"{arch}.yaml"
    return OmegaConf.load(path).get(key) if path.is_file() else None


def _check_norm_sites(cfg) -> list[str]:
    """The keys of model/norm_sites.py: refused where they cannot act, noted where ignored."""
    arch, norm, a, notes = cfg.arch.name, cfg.norm.name, cfg.arch, []
    traits = arch_traits(arch)
    for key in ("scale_resids", "dssn_c_attn", "dssn_c_mlp"):
        value = getattr(a, key)
        if value not in (None, False) and key not in traits.own_keys:
            notes.append(f"arch={arch} ignores arch.{key}={value} ({_owners(key)} only)")
    has_gain = norm_class(norm).has_gain
    no_gain = f"norm={norm}{' with norm.affine=false' if has_gain else ''} has no gain vector"
    gains = f"({'/'.join(gain_norms())} with norm.affine=true)"
    if a.gain_offset and not (has_gain and cfg.norm.affine):
        why = (
            f"arch={arch} stores each norm gain as 1 + w"
            if _arch_default(arch, "gain_offset")
            else ("arch.gain_offset=true stores each norm gain as 1 + w")
        )
        raise ConfigError(f"{why}; {no_gain} {gains}; arch.gain_offset=false keeps plain gains and is accepted")
    if traits.gain_init and not (has_gain and cfg.norm.affine):
        raise ConfigError(f"arch={arch} {traits.gain_init}; {no_gain} {gains}")
    if a.tiny_init and a.small_init:
        raise ConfigError("arch.tiny_init=true and arch.small_init=true both set the init std; choose one")
    if traits.scaled_init_advice and a.scaled_init:
        notes.append(f"arch={arch} with arch.scaled_init=true: {traits.scaled_init_advice}")
    return notes
