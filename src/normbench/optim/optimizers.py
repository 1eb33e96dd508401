"""Optimizers, the weight-decay policy, and LR schedules.

Optimizers (``optim=``; defaults and measured LR ranges in ``conf/optim/*.yaml``; ``optim.lr: auto``, the
reference recipe's LR carried to the width, is resolved by config/lr_rule.py):

- ``adamw``: ``torch.optim.AdamW``, fused kernels on CUDA, foreach elsewhere (``optim.fused``).
- ``sgd``: ``torch.optim.SGD`` with (Nesterov) momentum. Its weight decay is torch's coupled L2 term.
- ``lion``: no torch implementation, so :class:`Lion` is written out here from its paper
  (Chen et al. 2023, arXiv:2302.06675, Algorithm 2): ``c = b1*m + (1-b1)*g``,
  ``p -= lr*(sign(c) + wd*p)``, ``m = b2*m + (1-b2)*g``.
- ``muon``: :class:`normbench.optim.muon.Muon`, torch.optim.Muon's update written out on torch's public
  API (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/; the formulas, references and
  deviations are in its module), on the 2-D hidden matrices only; embeddings, the LM head, norm
  gains, biases and scalars go to AdamW (``optim.adamw_lr``), as in KellerJordan/Muon's README and
  modded-nanogpt. The lr adjustment is torch's default ``adjust_lr_fn="original"`` (Keller Jordan's
  ``sqrt(max(1, rows/cols))``), not Moonshot's ``match_rms_adamw``, so ``optim.lr`` is in Muon's own
  units (0.02..0.1 measured on model=tiny), not AdamW's. Muon's weight decay uses the unadjusted lr.
  Fused matrices are orthogonalized block by block (``split``, :func:`fused_splits`): the
  attention ``c_attn`` (3d x d) as q, k and v separately, and a SwiGLU ``c_fc`` (2f x d) as up
  and gate separately, exactly as if the model had separate Linear layers. modded-nanogpt does
  the same (separate c_q/c_k/c_v, later a (3, d, d) ``qkv_w`` orthogonalized batch-wise), and
  orthogonalizing the stack as one matrix would equalize singular values across q, k and v
  together and scale the step by sqrt(3) instead of 1.
- ``adafactor``: ``torch.optim.Adafactor`` (Shazeer & Stern 2018): relative step size, so the
  step on a tensor is ``min(lr, 1/sqrt(t)) * max(1e-3, RMS(p))`` times a normalized update;
  no first moment.

Parameter kinds drive the weight-decay policy (``optim.decay_*``); each module declares its
parameters' kinds and :func:`normbench.model.kinds.param_kinds` reads them:
``matrix`` (2-D hidden weights; always decayed when ``optim.weight_decay > 0``), ``head``
(untied LM head; always decayed), ``embed`` (token/position embeddings; a tied wte/lm_head
tensor is one ``embed`` tensor, so by default it is NOT decayed — nanoGPT decays it, set
``optim.decay_embed=true`` for nanoGPT's recipe; untying therefore also changes what is
decayed), ``norm_in`` (gains of norms on an input: sublayer input
norms, q/k/v norms, the final norm, the embedding norm), ``norm_out`` (gains whose output is
a sublayer output or the residual stream itself: Peri-LN output norms, Post-LN/DeepNorm/Mix-LN
norms after the residual add, and HybridNorm's FFN norm, which normalizes ``x + attn`` and
carries the residual), ``bias`` (every additive bias: Linear biases and LayerNorm/DyT/Derf
biases), ``scalar`` (DyT/Derf alpha and shift, the DyT/Derf embedding scale, nGPT alpha and
s vectors). nGPT never decays anything (its reference uses wd = 0); that rule wins over the
policy, with a start-up note.

The config decides hyperparameters, the checkpoint carries state: after any
``load_state_dict`` the groups' hyperparameters (lr, base_lr, weight decay, betas, ...) are
reset to the values this run was built with, so a resume with an allowed change of
``optim.lr`` really uses the new LR.

The schedule is a pure function of the step (:func:`lr_factor`), so resuming
needs no scheduler state beyond the step counter.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from normbench.config import lr_rule
from normbench.config.arch_traits import arch_traits
from normbench.config.spec import spec_of
from normbench.model import build_model, mup
from normbench.model.attention import Attention
from normbench.model.gpt import MLP
from normbench.model.kinds import KINDS, param_kinds  # noqa: F401 (KINDS: re-exported)
from normbench.model.mup import ONE, param_scales
from normbench.model.ngpt import NGPTBlock
from normbench.optim.muon import Muon
from normbench.runtime.distributed import is_dtensor


def fused_splits(model: nn.Module) -> dict[str, int]:
    """Fused weight matrices and their number of row blocks: c_attn (q, k, v) 3, SwiGLU c_fc (up, gate) 2."""
    splits: dict[str, int] = {}
    for name, mod in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(mod, (Attention, NGPTBlock)):
            splits[f"{prefix}c_attn.weight"] = 3
        if isinstance(mod, NGPTBlock) or (isinstance(mod, MLP) and mod.kind == "swiglu"):
            splits[f"{prefix}c_fc.weight"] = 2
    return splits


def decayed_kinds(ocfg, arch_name: str) -> set[str]:
    """The parameter kinds weight decay applies to: none on a unit-norm geometry, whose weights are projected
    back onto the sphere (ArchTraits.unit_norm_geometry)."""
    if arch_traits(arch_name).unit_norm_geometry or ocfg.weight_decay == 0:
        return set()
    kinds = {"matrix", "head"}
    switches = {
        "norm_in": ocfg.decay_norm_in,
        "norm_out": ocfg.decay_norm_out,
        "bias": ocfg.decay_bias,
        "scalar": ocfg.decay_scalars,
        "embed": ocfg.decay_embed,
    }
    kinds |= {kind for kind, on in switches.items() if on}
    return kinds


class Lion(torch.optim.Optimizer):
    """Lion (arXiv:2302.06675, Algorithm 2), decoupled weight decay."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if "exp_avg" not in self.state[p]:
                    self.state[p]["exp_avg"] = torch.zeros_like(p)
            grads = [p.grad for p in params]
            ms = [self.state[p]["exp_avg"] for p in params]
            if any(is_dtensor(p) for p in params):  # FSDP2 shards: elementwise ops, one tensor at a time
                for p, g, m in zip(params, grads, ms):
                    update = (m * b1 + g * (1 - b1)).sign_()
                    p.mul_(1 - lr * wd).add_(update, alpha=-lr)
                    m.mul_(b2).add_(g, alpha=1 - b2)
                continue
            # the same three lines for all tensors at once (one multi-tensor kernel per op on GPU)
            updates = torch._foreach_mul(ms, b1)
            torch._foreach_add_(updates, torch._foreach_mul(grads, 1 - b1))
            torch._foreach_sign_(updates)
            torch._foreach_mul_(params, 1 - lr * wd)
            torch._foreach_add_(params, updates, alpha=-lr)
            torch._foreach_mul_(ms, b2)
            torch._foreach_add_(ms, grads, alpha=1 - b2)
        return loss


class OptimizerList:
    """Several optimizers stepped as one (Muon + AdamW); torch.optim-like surface."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        self.kind_lrs: dict = {}  # {parameter kind: its peak LR}, set by build_optimizer (config/lr_rule.py)

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("optimizers", [])
        if len(saved) != len(self.optimizers):
            names = ", ".join(type(o).__name__ for o in self.optimizers)
            raise ValueError(f"checkpoint has {len(saved)} optimizer(s), this run {len(self.optimizers)} ({names})")
        for opt, s in zip(self.optimizers, saved):
            opt.load_state_dict(s)


def _keep_config_hparams(opt: torch.optim.Optimizer) -> None:
    """After any load_state_dict, put back this run's group hyperparameters (state stays loaded)."""
    built = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]

    def restore(optimizer: torch.optim.Optimizer) -> None:
        for group, hp in zip(optimizer.param_groups, built):
            group.update(hp)

    opt.register_load_state_dict_post_hook(restore)


@dataclass(frozen=True)
class OptimizerSpec:
    """How ``optim=<name>`` is built: ``build(groups, ocfg, device_type)`` returns the torch optimizers;
    ``groups(name)`` gives the weight-decay groups meant for ``name``. With ``matrices_apart``, the
    hidden 2-D matrices form the groups of ``name`` (``split``: row blocks of fused projections) and
    every other parameter the groups of ``adamw`` (Muon's recipe)."""

    build: Callable[[Callable[[str], list[dict]], Any, str], list[torch.optim.Optimizer]]
    matrices_apart: bool = False


# The optimizer registry: ``optim=<name>``, validation, error messages and ``list`` read it (normbench/validation.py).
OPTIMIZERS: dict[str, OptimizerSpec] = {}


def register_optimizer(name: str, matrices_apart: bool = False):
    """Decorator: ``build(groups, ocfg, device_type) -> list of optimizers`` becomes ``optim=<name>``
    (a conf/optim/<name>.yaml gives its defaults)."""

    def deco(build):
        OPTIMIZERS[name] = OptimizerSpec(build, matrices_apart)
        return build

    return deco


def _adamw(groups: list[dict], lr: float, ocfg, device_type: str) -> torch.optim.AdamW:
    fused = ocfg.fused if ocfg.fused is not None else device_type == "cuda"
    kw = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(ocfg.betas), eps=ocfg.eps, **kw)


@register_optimizer("adamw")
def _build_adamw(groups, ocfg, device_type):
    return [_adamw(groups("adamw"), ocfg.lr, ocfg, device_type)]


@register_optimizer("sgd")
def _build_sgd(groups, ocfg, device_type):
    nesterov = ocfg.nesterov and ocfg.momentum > 0
    return [torch.optim.SGD(groups("sgd"), lr=ocfg.lr, momentum=ocfg.momentum, nesterov=nesterov)]


@register_optimizer("lion")
def _build_lion(groups, ocfg, device_type):
    return [Lion(groups("lion"), lr=ocfg.lr, betas=tuple(ocfg.betas))]


@register_optimizer("muon", matrices_apart=True)
def _build_muon(groups, ocfg, device_type):
    lr = ocfg.adamw_lr if ocfg.adamw_lr is not None else ocfg.lr  # the AdamW side's
    out = [_adamw(groups("adamw"), lr, ocfg, device_type)]
    if matrices := groups("muon"):
        out.append(Muon(matrices, lr=ocfg.lr, momentum=ocfg.momentum, nesterov=ocfg.nesterov, ns_steps=ocfg.ns_steps))
    return out


@register_optimizer("adafactor")
def _build_adafactor(groups, ocfg, device_type):
    return [torch.optim.Adafactor(groups("adafactor"), lr=ocfg.lr)]


def base_shapes(model: nn.Module, cfg) -> dict[str, tuple[int, ...]]:
    """Under muP, each parameter's shape in the same model built at d_base on the meta device (no memory, no
    init cost; microsoft/mup's base shapes); {} under sp."""
    if not mup.active(cfg.model):
        return {}

    with torch.device("meta"):
        return mup.shapes(build_model(mup.base_config(cfg), model.vocab_size))


def build_optimizer(model: nn.Module, cfg, log=print) -> OptimizerList:
    """The configured optimizer with its weight-decay groups; logs one line per group."""
    ocfg = lr_rule.WithLR(cfg.optim, spec_of(cfg).lr)  # optim.lr as its number (auto resolved once: config/spec.py)
    name = ocfg.name
    kinds = param_kinds(model)
    params = dict(model.named_parameters())
    decay = decayed_kinds(ocfg, cfg.arch.name)
    spec = OPTIMIZERS.get(name)
    if spec is None:
        raise ValueError(f"unknown optimizer {name!r}")
    splits = fused_splits(model) if spec.matrices_apart else {}
    main_name = "adamw" if spec.matrices_apart else name
    scales = param_scales(model, cfg, kinds, base_shapes(model, cfg))  # muP's lr/wd/eps multipliers; sp: {}
    # (optimizer, decayed, split, muP scale) -> parameter names
    by_group: dict[tuple, list[str]] = defaultdict(list)
    for pname, kind in kinds.items():
        scale = scales.get(pname, ONE)
        if spec.matrices_apart and kind == "matrix" and params[pname].ndim == 2:
            by_group[(name, kind in decay, splits.get(pname, 1), scale)].append(pname)
        else:
            by_group[(main_name, kind in decay, 1, scale)].append(pname)
    ordered = sorted(by_group.items(), key=lambda kv: (*kv[0][:3], -kv[0][3].lr, kv[0][3].eps))

    for (opt_name, decayed, split, scale), names in ordered:
        kinds_here = "/".join(sorted({kinds[n] for n in names}))
        examples = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        n_el = sum(params[n].numel() for n in names)
        blocks = f", orthogonalized as {split} row blocks" if split > 1 else ""
        mup_note = "" if scale == ONE else f", muP lr x{scale.lr:.4g} eps x{scale.eps:.4g}"
        log(
            f"param group [{opt_name}] wd={ocfg.weight_decay * scale.wd if decayed else 0:g}: {len(names)} tensors, "
            f"{n_el:,} params ({kinds_here}{blocks}{mup_note}) e.g. {examples}"
        )

    def groups(which: str) -> list[dict]:
        out = []
        for (opt_name, decayed, split, scale), names in ordered:
            if opt_name == which:
                wd = ocfg.weight_decay * scale.wd if decayed else 0.0
                g = {"params": [params[n] for n in names], "weight_decay": wd}
                if spec.matrices_apart and which == name:
                    g["split"] = split
                if scale != ONE:  # read after the optimizer is built: its lr is the optimizer's own default
                    g["mup_scale"] = scale
                out.append(g)
        return out

    device_type = next(model.parameters()).device.type
    optimizers = spec.build(groups, ocfg, device_type)
    for opt in optimizers:
        for g in opt.param_groups:
            scale = g.pop("mup_scale", ONE)
            g["lr"] = g["lr"] * scale.lr if scale.lr != 1.0 else g["lr"]
            if scale.eps != 1.0 and "eps" in g:
                g["eps"] = g["eps"] * scale.eps
            g["base_lr"] = g["lr"]
        _keep_config_hparams(opt)
    return lr_rule.record_kind_lrs(OptimizerList(optimizers), kinds, params)


def warmup_steps(scfg, max_steps: int) -> int:
    """``sched.warmup_steps``, or 10% of the run when it is null (Mix-LN's recipe)."""
    return scfg.warmup_steps if scfg.warmup_steps is not None else int(0.1 * max_steps)


def lr_factor(step: int, max_steps: int, scfg) -> float:
    """Multiplier of the base LR at ``step`` (0-based) for warmup + cosine / wsd / constant.

    Warmup: ``(step + 1) / warmup`` for ``step < warmup`` (none when warmup is 0).
    cosine: from 1 at ``step = warmup`` to ``min_lr_ratio`` at ``step = max_steps``.
    wsd (warmup-stable-decay, Hu et al. 2024, MiniCPM): 1 until the last
    ``decay_fraction * max_steps`` steps (never inside the warmup), then linear to
    ``min_lr_ratio`` at ``step = max_steps``. The floor is reached at the end of the run,
    so the last executed step (``max_steps - 1``) is one decay step above it.
    """
    warmup = warmup_steps(scfg, max_steps)
    if step < warmup:
        return (step + 1) / warmup
    if scfg.name == "constant":
        return 1.0
    floor = scfg.min_lr_ratio
    if scfg.name == "cosine":
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if scfg.name != "wsd":
        raise ValueError(f"unknown schedule {scfg.name!r}")
    decay_start = max(warmup, max_steps - int(round(scfg.decay_fraction * max_steps)))
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start) / max(1, max_steps - decay_start))
    return 1.0 - (1.0 - floor) * progress


def set_lr(optimizer: OptimizerList, factor: float) -> float:
    """Every group's lr = its base lr x ``factor``; returns the first group's lr (for the log)."""
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * factor
    return optimizer.param_groups[0]["lr"]
