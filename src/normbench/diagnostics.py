"""Training diagnostics: per-layer gradient norms, residual-stream growth, massive activations.

What the papers argue with (shared/ARCHITECTURES.md §5): Peri-LN (hidden-state
variance and magnitude per layer, Output-LN gains), Mix-LN/NormFormer (per-layer
gradient norms), massive activations (Sun et al. 2024, locuslab/massive-activations:
max |x| and max/median per layer), QK-norm work (attention logit max, entropy),
Mix-LN / layer pruning (angular distance ``1 - cos`` between consecutive blocks).

Definitions (the same for every architecture, so a sweep compares like with like):
- The residual stream ``h_l`` is the hidden state *between* blocks: ``h_0`` after
  the embedding (and embedding norm/scale, if any), ``h_l`` the output of block
  l-1. For Post-LN and DeepNorm that is the block's normalized output; for nGPT
  the unit-norm hidden state. Statistics are over all tokens and features of a
  fixed held-out batch (``diag.batch`` sequences), in fp32:
  ``var_resid`` = population variance, ``rms_resid`` = sqrt(mean x^2),
  ``maxabs_resid`` = max |x|, ``massive_ratio_resid`` = max |x| / median |x|.
- ``grad_norm_layer[l]`` = L2 norm of all gradients of block l (before clipping);
  ``grad_norm_attn``/``grad_norm_mlp`` the same over each sublayer (its norms included).
- ``update_ratio_layer[l]`` = ||theta_after - theta_before|| / ||theta_before|| over block l.

Cost: no hooks at all (the model's forward fills a ``hidden`` list only when
asked, and attention modules compute their statistics only while ``stats`` is
set); everything is gathered on the device and moved to the host in one transfer
per diagnostic step (``torch._foreach_norm`` for gradient and update norms).
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

from normbench.model.norms import Derf, DyT

_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_NGPT_ATTN = ("c_attn", "att_c_proj", "attn_alpha", "sqk")


def sublayer_of(name: str) -> str:
    """'attn' or 'mlp' for a parameter inside a block (GPT or nGPT naming)."""
    if ".attn." in name:
        return "attn"
    if ".mlp." in name:
        return "mlp"
    return "attn" if any(f".{k}." in name for k in _NGPT_ATTN) else "mlp"


class _Gather:
    """Tensors computed on the device, moved to the host in one transfer."""

    def __init__(self):
        self.keys: list[tuple[str, int, bool]] = []
        self.parts: list[torch.Tensor] = []

    def add(self, key: str, value: torch.Tensor) -> None:
        flat = value.detach().float().reshape(-1)
        self.keys.append((key, flat.numel(), value.dim() == 0))
        self.parts.append(flat)

    def result(self) -> dict:
        if not self.parts:
            return {}
        values = torch.cat([p.to(self.parts[0].device) for p in self.parts]).tolist()
        out, i = {}, 0
        for key, n, scalar in self.keys:
            out[key] = values[i] if scalar else values[i : i + n]
            i += n
        return out


def residual_stats(hidden: list[torch.Tensor], full: bool, g: _Gather) -> None:
    h = torch.stack([x.detach().float() for x in hidden])  # (L+1, B, T, d)
    flat = h.reshape(h.shape[0], -1)
    absval = flat.abs()
    var = flat.var(dim=1, unbiased=False)
    g.add("var_resid", var)
    g.add("rms_resid", flat.pow(2).mean(dim=1).sqrt())
    maxabs = absval.amax(dim=1)
    g.add("maxabs_resid", maxabs)
    g.add("massive_ratio_resid", maxabs / absval.median(dim=1).values.clamp_min(1e-12))
    if full:
        centered = flat - flat.mean(dim=1, keepdim=True)
        g.add("kurtosis_resid", centered.pow(4).mean(dim=1) / var.clamp_min(1e-12).pow(2))
        tokens = h.reshape(h.shape[0], -1, h.shape[-1])  # (L+1, B*T, d)
        cos = nn.functional.cosine_similarity(tokens[:-1], tokens[1:], dim=-1, eps=1e-8)
        g.add("angular_dist_layer", (1.0 - cos).mean(dim=1))


class Diagnostics:
    def __init__(self, dcfg, model: nn.Module, batch: torch.Tensor):
        self.cfg, self.model = dcfg, model
        self.enabled = dcfg.name != "off"
        self.full = dcfg.name == "full"
        self.batch = batch  # (B, T+1) fixed held-out tokens
        self.n_layer = len(model.blocks)
        names, layer, sub = [], [], []
        self.params: list[nn.Parameter] = []
        for name, p in model.named_parameters():
            m = _BLOCK.match(name)
            if m is None:
                continue
            names.append(name)
            self.params.append(p)
            layer.append(int(m.group(1)))
            sub.append(sublayer_of(name))
        self.names = names
        self.layer_index = torch.tensor(layer)
        self.sub_index = torch.tensor([0 if s == "attn" else 1 for s in sub])
        self._before: list[torch.Tensor] | None = None
        self._pending = _Gather()

    # --- around the optimizer step ---
    def grad_norms(self) -> None:
        """Per-layer and per-sublayer gradient norms; call before clipping."""
        grads = [p.grad for p in self.params]
        if any(gr is None for gr in grads) or not grads:
            return
        norms_sq = torch.stack(torch._foreach_norm(grads)).float().pow(2)
        device = norms_sq.device
        layer, sub = self.layer_index.to(device), self.sub_index.to(device)
        per_layer = torch.zeros(self.n_layer, device=device).index_add_(0, layer, norms_sq)
        per_sub = torch.zeros(2 * self.n_layer, device=device).index_add_(0, layer * 2 + sub, norms_sq)
        self._pending.add("grad_norm_layer", per_layer.sqrt())
        self._pending.add("grad_norm_attn", per_sub[0::2].sqrt())
        self._pending.add("grad_norm_mlp", per_sub[1::2].sqrt())

    def before_step(self) -> None:
        self._before = [p.detach().clone() for p in self.params]

    def after_step(self) -> None:
        if self._before is None:
            return
        delta = torch._foreach_sub([p.detach() for p in self.params], self._before)
        d_sq = torch.stack(torch._foreach_norm(delta)).float().pow(2)
        p_sq = torch.stack(torch._foreach_norm(self._before)).float().pow(2)
        layer = self.layer_index.to(d_sq.device)
        d_layer = torch.zeros(self.n_layer, device=d_sq.device).index_add_(0, layer, d_sq)
        p_layer = torch.zeros(self.n_layer, device=d_sq.device).index_add_(0, layer, p_sq)
        self._pending.add("update_ratio_layer", d_layer.sqrt() / p_layer.sqrt().clamp_min(1e-12))
        self._before = None

    # --- the fixed-batch forward ---
    def attention_modules(self) -> list[nn.Module]:
        return [getattr(b.attn, "core", b) if hasattr(b, "attn") else b for b in self.model.blocks]

    @torch.no_grad()
    def collect(self) -> dict:
        """Everything for this diagnostic step, moved to the host in one transfer."""
        g, self._pending = self._pending, _Gather()
        was_training = self.model.training
        self.model.eval()
        attn = self.attention_modules() if self.full else []
        for mod in attn:
            mod.stats = {}
        device = next(self.model.parameters()).device
        batch = self.batch.to(device)
        hidden: list[torch.Tensor] = []
        logits, _ = self.model(batch[:, :-1], batch[:, 1:], hidden=hidden)
        residual_stats(hidden, self.full, g)
        g.add("logit_maxabs", logits.detach().float().abs().amax())
        if attn:
            g.add("attn_entropy", torch.stack([m.stats["attn_entropy"] for m in attn]))
            g.add("attn_logit_max", torch.stack([m.stats["attn_logit_max"] for m in attn]))
            for mod in attn:
                mod.stats = None
        self.learned_scalars(g)
        self.model.train(was_training)
        return g.result()

    def learned_scalars(self, g: _Gather) -> None:
        """DyT/Derf alpha and shift per site, nGPT alpha and s means, Output-norm gain means."""
        blocks = self.model.blocks
        if hasattr(blocks[0], "attn_alpha"):  # nGPT: effective values
            for key, attr in (
                ("ngpt_alpha_attn", "attn_alpha"),
                ("ngpt_alpha_mlp", "mlp_alpha"),
                ("ngpt_sqk", "sqk"),
                ("ngpt_suv", "suv"),
            ):
                vals = [getattr(b, attr)() for b in blocks]
                g.add(key, torch.stack([v.abs().mean() if "alpha" in key else v.mean() for v in vals]))
            g.add("ngpt_sz", self.model.sz().mean())
            return
        for site in ("attn", "mlp"):
            alphas, shifts, gains = [], [], []
            for b in blocks:
                sub = getattr(b, site)
                mods = [m for m in (sub.norm_in, sub.norm_out, sub.norm_post) if isinstance(m, (DyT, Derf))]
                if mods:
                    alphas.append(torch.stack([m.alpha.squeeze() for m in mods]).mean())
                    shifts += (
                        [torch.stack([m.shift.squeeze() for m in mods]).mean()] if mods[0].shift is not None else []
                    )
                if sub.norm_out is not None and getattr(sub.norm_out, "weight", None) is not None:
                    gains.append(sub.norm_out.weight.mean())
            if len(alphas) == len(blocks):
                g.add(f"norm_alpha_{site}", torch.stack(alphas))
            if shifts and len(shifts) == len(blocks):
                g.add(f"norm_shift_{site}", torch.stack(shifts))
            if gains and len(gains) == len(blocks):
                g.add(f"out_norm_gain_{site}", torch.stack(gains))
        ln_f = getattr(self.model, "ln_f", None)
        if isinstance(ln_f, (DyT, Derf)):
            g.add("norm_alpha_final", ln_f.alpha.squeeze())
        scale = getattr(self.model, "emb_scale", None)
        if scale is not None:
            g.add("embed_scale", scale.scale.squeeze())
