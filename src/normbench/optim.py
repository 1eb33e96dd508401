"""Optimizers, the weight-decay policy, and LR schedules.

Optimizers come from ``torch.optim`` (AdamW, SGD, Muon, Adafactor). Lion has no
torch implementation, so it is written out here from its paper (Chen et al.
2023, arXiv:2302.06675, Algorithm 2: ``u = sign(b1*m + (1-b1)*g)``,
``p -= lr*(u + wd*p)``, ``m = b2*m + (1-b2)*g``). Muon follows its reference
(Keller Jordan's modded-nanogpt): Newton-Schulz orthogonalized momentum for 2-D
hidden matrices only; embeddings, head, norms, biases and scalars use AdamW.

Parameter kinds (:func:`param_kinds`) drive the weight-decay policy:
``matrix`` (2-D hidden weights, always decayed), ``head`` (untied LM head,
decayed), ``embed``, ``norm_in`` (norms on a sublayer input, QK-norm, final
norm), ``norm_out`` (Peri-LN output norms, Post-LN/DeepNorm norms after the
residual), ``bias``, ``scalar`` (DyT/Derf alpha and shift, embedding scale, nGPT
alpha and s). nGPT never decays anything (its reference uses wd = 0).

The schedule is a pure function of the step (:func:`lr_factor`), so resuming
needs no scheduler state beyond the step counter.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn as nn

from normbench.model.norms import Derf, DyT, LayerNorm, RMSNorm

NORM_TYPES = (LayerNorm, RMSNorm, DyT, Derf)
KINDS = ("matrix", "head", "embed", "norm_in", "norm_out", "bias", "scalar")


def param_kinds(model: nn.Module) -> dict[str, str]:
    """Map each (deduplicated) parameter name to its kind."""
    kinds: dict[str, str] = {}
    seen: set[int] = set()
    for mod_name, mod in model.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            leaf = mod_name.rsplit(".", 1)[-1]
            if isinstance(mod, NORM_TYPES):
                if p_name in ("alpha", "shift"):
                    kinds[name] = "scalar"
                else:
                    kinds[name] = "norm_out" if leaf in ("norm_out", "norm_post") else "norm_in"
            elif isinstance(mod, nn.Embedding):
                kinds[name] = "embed"
            elif isinstance(mod, nn.Linear):
                kinds[name] = "bias" if p_name == "bias" else ("head" if leaf == "lm_head" else "matrix")
            else:
                kinds[name] = "scalar"
    return kinds


def decayed_kinds(ocfg, arch_name: str) -> set[str]:
    if arch_name == "ngpt" or ocfg.weight_decay == 0:
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
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                update = (m * b1 + p.grad * (1 - b1)).sign_()
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)
        return loss


class OptimizerList:
    """Several optimizers stepped as one (Muon + AdamW); torch.optim-like surface."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

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
        for opt, s in zip(self.optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(s)


def build_optimizer(model: nn.Module, cfg, log=print) -> OptimizerList:
    """The configured optimizer with decay/no-decay groups; logs one line per group."""
    ocfg = cfg.optim
    kinds = param_kinds(model)
    params = dict(model.named_parameters())
    decay = decayed_kinds(ocfg, cfg.arch.name)
    if cfg.arch.name == "ngpt" and ocfg.weight_decay > 0:
        log(f"note: arch=ngpt uses no weight decay anywhere (optim.weight_decay={ocfg.weight_decay} ignored)")
    by_group: dict[tuple[str, bool], list[str]] = defaultdict(list)
    for name, kind in kinds.items():
        is_muon = ocfg.name == "muon" and kind == "matrix" and params[name].ndim == 2
        by_group[("muon" if is_muon else "main", kind in decay)].append(name)

    def groups(which: str) -> list[dict]:
        out = []
        for (opt_name, decayed), names in sorted(by_group.items()):
            if opt_name != which or not names:
                continue
            wd = ocfg.weight_decay if decayed else 0.0
            out.append({"params": [params[n] for n in names], "weight_decay": wd, "names": names})
        return out

    for (opt_name, decayed), names in sorted(by_group.items()):
        kinds_here = sorted({kinds[n] for n in names})
        examples = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        n_el = sum(params[n].numel() for n in names)
        log(
            f"param group [{opt_name}] wd={ocfg.weight_decay if decayed else 0:g}: {len(names)} tensors, "
            f"{n_el:,} params ({'/'.join(kinds_here)}) e.g. {examples}"
        )

    main_groups, muon_groups = groups("main"), groups("muon")
    for g in main_groups + muon_groups:
        del g["names"]
    device_type = next(model.parameters()).device.type
    optimizers: list[torch.optim.Optimizer] = []
    if ocfg.name == "adamw" or ocfg.name == "muon":
        lr = ocfg.lr if ocfg.name == "adamw" else (ocfg.adamw_lr or ocfg.lr)
        fused = ocfg.fused if ocfg.fused is not None else device_type == "cuda"
        kw = {"fused": True} if fused else {"foreach": True}
        optimizers.append(torch.optim.AdamW(main_groups, lr=lr, betas=tuple(ocfg.betas), eps=ocfg.eps, **kw))
        if muon_groups:
            optimizers.append(
                torch.optim.Muon(
                    muon_groups, lr=ocfg.lr, momentum=ocfg.momentum, nesterov=ocfg.nesterov, ns_steps=ocfg.ns_steps
                )
            )
    elif ocfg.name == "sgd":
        nesterov = ocfg.nesterov and ocfg.momentum > 0
        optimizers.append(torch.optim.SGD(main_groups, lr=ocfg.lr, momentum=ocfg.momentum, nesterov=nesterov))
    elif ocfg.name == "lion":
        optimizers.append(Lion(main_groups, lr=ocfg.lr, betas=tuple(ocfg.betas)))
    elif ocfg.name == "adafactor":
        optimizers.append(torch.optim.Adafactor(main_groups, lr=ocfg.lr))
    for opt in optimizers:
        for g in opt.param_groups:
            g["base_lr"] = g["lr"]
    return OptimizerList(optimizers)


def warmup_steps(scfg, max_steps: int) -> int:
    """``sched.warmup_steps``, or 10% of the run when it is null (Mix-LN's recipe)."""
    return scfg.warmup_steps if scfg.warmup_steps is not None else int(0.1 * max_steps)


def lr_factor(step: int, max_steps: int, scfg) -> float:
    """Multiplier of the base LR at ``step`` (0-based) for warmup + cosine / wsd / constant."""
    warmup = warmup_steps(scfg, max_steps)
    if step < warmup:
        return (step + 1) / warmup
    if scfg.name == "constant":
        return 1.0
    floor = scfg.min_lr_ratio
    if scfg.name == "cosine":
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    # wsd: stable at 1, then linear decay to the floor over the last decay_fraction of the run
    decay_steps = max(1, int(round(scfg.decay_fraction * max_steps)))
    decay_start = max_steps - decay_steps
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start) / decay_steps)
    return 1.0 - (1.0 - floor) * progress


def set_lr(optimizer: OptimizerList, factor: float) -> float:
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * factor
    return optimizer.param_groups[0]["lr"]
