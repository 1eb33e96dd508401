"""Where each architecture puts its norms: placement as data, not as block classes.

Every softmax-attention architecture is one :class:`~normbench.model.gpt.Block`
whose two sublayers (attention, MLP) compute, for a sublayer function f::

    h  = N_in(x)            if in_norm            else x
    x  = h                  if residual_after_norm (the residual is taken after N_in)
    y  = N_out(f(h))        if out_norm           else f(h)
    x' = N_post(alpha*x + y) if post_norm         else alpha*x + y

References (equations and citations in docs/architectures.md §3):
- pre_ln: nanoGPT model.py L103-105.            ``x + f(N(x))``
- post_ln: Vaswani et al. 2017; torchscale decoder (no final norm by default).  ``N(x + f(x))``
- peri_ln: Kim et al. 2025, arXiv:2502.02732; OLMo-core PeriNormTransformerBlock.  ``x + N(f(N(x)))``
- mix_ln: Li et al. 2024, pixeli99/MixLN (post_pre): Post-LN for blocks l < floor(post_ratio*L), Pre-LN after.
- hybridnorm: Zhuo et al. 2025, BryceZhuo/HybridNorm: q/k/v norm and no attention input norm;
  FFN ``z = N(y); x' = z + F(z)``.  hybridnorm_star: block 0 is Pre-Norm plus q/k/v norm.
- deepnorm: Wang et al. 2022, arXiv:2203.00555; torchscale: ``N(alpha*x + f(x))``, alpha=(2L)^(1/4).
- lns, reordered, sandwich, sandwich_depth, normformer: model/norm_sites.py (their papers there).

``arch.qk_norm`` adds q/k norms before RoPE to any softmax arch: ``head`` per head over d_h
(Qwen3/Gemma 3), ``width`` one norm over each whole projection width d before the split into
heads (OLMo 2, allenai/OLMo-core ``use_head_qk_norm=False``); the old ``true``/``false`` read as
head/none. hybridnorm/hybridnorm_star always have per-head q/k/v norms, whatever ``arch.qk_norm`` says.
Mix-LN with ``floor(post_ratio * L) = 0`` (e.g. L=2 at 0.25) is all Pre-LN, as in the reference.

Choices between paper and reference code (also in each ``conf/arch/*.yaml``):
- mix_ln: every weight N(0, 0.02), the embedding too (the MixLN repo draws the embedding from
  N(0, sqrt(2/5)); ``arch.embed_init_std=0.632`` restores it). The final norm cannot be switched off.
- hybridnorm: the norm's eps is ``norm.eps`` (1e-6 for RMSNorm); the reference's OLMo config uses
  1e-5 (``norm.eps=1e-5`` matches it).
- deepnorm: the paper's init (xavier-normal, gain beta on v, out-projection and FFN; q, k gain 1),
  not torchscale's name-based rescaling. The paper has no GLU: with ``model.mlp=swiglu`` both
  halves of ``c_fc`` (up and gate) get gain beta, as two FFN input matrices would; torchscale's GLU
  scales fc1 and fc2 by name and leaves its gate at plain xavier.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from normbench.config.arch_traits import ARCH_TRAITS, register_arch


@dataclass(frozen=True)
class SublayerSpec:
    in_norm: bool = False
    out_norm: bool = False
    post_norm: bool = False
    residual_after_norm: bool = False
    alpha: float = 1.0
    in_scale: float = 1.0  # the input norm's output times this constant (LNS: 1/sqrt(l))
    out_gain: float = 1.0  # the output norm's gain at init (depth-scaled sandwich: c/sqrt(L))
    resid_scale: bool = False  # a learned vector lambda (init 1) on the residual: lambda*x + y (NormFormer)
    mid_norm: bool = False  # MLP only: a norm over d_ff after the activation (NormFormer)


@dataclass(frozen=True)
class BlockSpec:
    attn: SublayerSpec
    mlp: SublayerSpec
    qk_norm: bool = False
    v_norm: bool = False
    qk_width: bool = False  # the q/k norms span the whole projection width d, not one head (OLMo 2)
    head_scale: bool = False  # a learned scale per attention head before the out-projection (NormFormer)


PRE = SublayerSpec(in_norm=True)
POST = SublayerSpec(post_norm=True)
PERI = SublayerSpec(in_norm=True, out_norm=True)


def deepnorm_alpha(n_layer: int) -> float:
    """Decoder-only DeepNorm residual scale (2L)^(1/4) (arXiv:2203.00555, torchscale decoder.py)."""
    return (2 * n_layer) ** 0.25


def deepnorm_beta(n_layer: int) -> float:
    """Decoder-only DeepNorm init gain (8L)^(-1/4) for FFN, v and output projections."""
    return (8 * n_layer) ** -0.25


def mix_ln_post_blocks(n_layer: int, post_ratio: float) -> int:
    """Number of leading Post-LN blocks in Mix-LN: floor(post_ratio * L) (paper: 0.25)."""
    return math.floor(post_ratio * n_layer + 1e-9)


def qk_kwargs(arch) -> dict:
    """BlockSpec's q/k-norm fields for ``arch.qk_norm`` (none | head | width; old bools too)."""
    from normbench.config.schema import qk_norm_mode  # deferred (start-up time): hydra, omegaconf

    mode = qk_norm_mode(arch.qk_norm)
    return {"qk_norm": mode != "none", "qk_width": mode == "width"}


# ``arch=`` names with a block placement -> specs(arch_cfg, n_layer) (docs/architectures.md §3).
# nGPT is not a placement but its own model (model/ngpt.py). A new placement registers here.
PLACEMENTS: dict[str, Callable[[Any, int], list[BlockSpec]]] = {}


def register_placement(name: str, **traits: Any):
    """Register a placement's specs function as ``arch=name``, with its ``ArchTraits`` (config/arch_traits.py) as
    keyword fields."""

    def register(specs: Callable[[Any, int], list[BlockSpec]]) -> Callable[[Any, int], list[BlockSpec]]:
        PLACEMENTS[name] = specs
        register_arch(name, **traits)
        return specs

    return register


def arch_names() -> tuple[str, ...]:
    """``arch=`` names: the block placements in registration order, then the archs with a model of their own."""
    return (*PLACEMENTS, *(name for name in ARCH_TRAITS if name not in PLACEMENTS))


@register_placement("pre_ln", needs_norm=False)
def _pre_ln(arch, n_layer: int) -> list[BlockSpec]:
    return [BlockSpec(PRE, PRE, **qk_kwargs(arch))] * n_layer


@register_placement("post_ln")
def _post_ln(arch, n_layer: int) -> list[BlockSpec]:
    return [BlockSpec(POST, POST, **qk_kwargs(arch))] * n_layer


@register_placement(
    "peri_ln", extra_norms=2, learned_gains="removes Peri-LN's Output-norm gains, which its paper keeps learnable"
)
def _peri_ln(arch, n_layer: int) -> list[BlockSpec]:
    return [BlockSpec(PERI, PERI, **qk_kwargs(arch))] * n_layer


@register_placement(
    "mix_ln", own_keys=("post_ratio",), keeps_final_norm="always applies the final norm (Li et al. 2024)"
)
def _mix_ln(arch, n_layer: int) -> list[BlockSpec]:
    k, qk = mix_ln_post_blocks(n_layer, arch.post_ratio), qk_kwargs(arch)
    return [BlockSpec(POST, POST, **qk) if i < k else BlockSpec(PRE, PRE, **qk) for i in range(n_layer)]


@register_placement("hybridnorm", extra_norms=2, qkv_norms=True, qk_normed=True)
def _hybridnorm(arch, n_layer: int) -> list[BlockSpec]:
    return [BlockSpec(SublayerSpec(), SublayerSpec(in_norm=True, residual_after_norm=True), True, True)] * n_layer


@register_placement("hybridnorm_star", extra_norms=2, qkv_norms=True, qk_normed=True)
def _hybridnorm_star(arch, n_layer: int) -> list[BlockSpec]:
    return [BlockSpec(PRE, PRE, qk_norm=True, v_norm=True)] + _hybridnorm(arch, n_layer)[1:]


@register_placement("deepnorm", own_keys=("alpha", "beta"), deepnorm_init=True)
def _deepnorm(arch, n_layer: int) -> list[BlockSpec]:
    alpha = arch.alpha if arch.alpha is not None else deepnorm_alpha(n_layer)
    sub = SublayerSpec(post_norm=True, alpha=alpha)
    return [BlockSpec(sub, sub, **qk_kwargs(arch))] * n_layer


def block_specs(arch, n_layer: int) -> list[BlockSpec]:
    """The per-block placement for ``arch`` (an ArchConfig) and depth ``n_layer``."""
    if arch.name not in PLACEMENTS:
        raise ValueError(
            f"arch {arch.name!r} has no block placement (ngpt is its own model); placements: {', '.join(PLACEMENTS)}"
        )
    return PLACEMENTS[arch.name](arch, n_layer)
