"""Training diagnostics: per-layer gradient norms, residual-stream growth, massive activations.

What the papers argue with: Peri-LN (Kim et al. 2025, arXiv:2502.02732: hidden-state
variance and magnitude per layer, Output-LN gains), Mix-LN (Li et al. 2024,
arXiv:2412.13795) and NormFormer (per-layer gradient norms), massive activations
(Sun et al. 2024, arXiv:2402.17762, locuslab/massive-activations: max |x| and max/median
per layer), QK-norm work (attention logit max, entropy),
Mix-LN / layer pruning (angular distance ``1 - cos`` between consecutive blocks).

When (``diag=``): ``off`` does nothing at all; ``default`` and ``full`` take a
diagnostic step at the first optimizer step and then whenever the number of
steps done is a multiple of ``diag.every``. The record of a diagnostic step
(``step`` = steps done, counting it) holds the gradient norms and update ratios
of that step and the fixed-batch statistics of the weights *after* it.

Definitions (the same for every architecture, so a sweep compares like with like).
Per-block lists are indexed by block ``l`` (0-based, ``n_layer`` entries);
``*_resid`` lists have ``n_layer + 1`` entries, index ``l`` = ``h_l``:

- The residual stream ``h_l`` is the hidden state *between* blocks, exactly what
  the next block receives: ``h_0`` after the embedding (positional embedding,
  embedding scale/norm and dropout included), ``h_{l+1}`` the output of block l.
  Pre-LN, Peri-LN, Mix-LN's Pre-LN blocks and HybridNorm: the un-normalized
  residual sum. Post-LN, DeepNorm and Mix-LN's Post-LN blocks: the block's
  normalized output ``N(alpha x + f(x))``. nGPT: the unit-norm hidden state (every
  token vector has L2 norm 1, so ``rms_resid = 1/sqrt(d)`` exactly). The final norm
  (``ln_f``) is not part of the stream. All statistics are over all tokens and
  features of a fixed held-out batch (``diag.batch`` sequences of the validation
  split, the same for every run with the same data), in fp32, model in eval mode:
  ``var_resid`` = population variance (mean of (x - mean)^2),
  ``rms_resid`` = sqrt(mean x^2),
  ``maxabs_resid`` = max |x| (massive activations),
  ``massive_ratio_resid`` = max |x| / median |x| (median = the lower middle value,
  ``torch.median``; Sun et al. call |x| > 100 and ~1000x the median "massive").
- ``logit_maxabs`` = max |logit| of the LM head over the fixed batch (after nGPT's s_z).
- ``grad_norm`` (every record) = L2 norm of all gradients, before clipping.
  ``grad_norm_layer[l]`` = L2 norm of the gradients of all of block l's parameters
  (before clipping; after gradient accumulation, all-reduce and fp16 unscaling);
  ``grad_norm_attn[l]`` / ``grad_norm_mlp[l]`` the same over the attention / MLP
  sublayer, each with its own norms (GPT: ``blocks.l.attn.*`` / ``blocks.l.mlp.*``;
  nGPT: c_attn, att_c_proj, attn_alpha, sqk / c_fc, mlp_c_proj, mlp_alpha, suv), so
  ``attn^2 + mlp^2 = layer^2``. ``grad_norm_other`` = the same over every parameter
  outside the blocks (embeddings, final norm, LM head, nGPT s_z), so
  ``sum_l grad_norm_layer[l]^2 + grad_norm_other^2 = grad_norm^2``.
  A parameter without a gradient counts as zero.
- ``update_ratio_layer[l]`` = ||theta_after - theta_before|| / ||theta_before|| over all
  of block l's parameters around the optimizer step (for nGPT ``theta_after`` is
  after the re-normalization of the weights; a skipped step gives 0).
- ``diag=full`` adds: ``attn_entropy[l]`` = mean over batch, heads and query
  positions of the entropy (nats) of block l's causal attention distribution
  (row t has t+1 keys, row 0 always entropy 0); ``attn_logit_max[l]`` = max
  pre-softmax attention logit ``scale * q.k`` over allowed (causal) positions,
  with the scale the model uses (1/sqrt(d_head); nGPT: sqrt(d_head) with s_qk
  folded into q and k), after q/k norms and RoPE; ``kurtosis_resid[l]`` =
  E[(x - mean)^4] / var^2 of h_l over all tokens and features (Pearson, 3 for a
  Gaussian); ``angular_dist_layer[l]`` = mean over tokens of
  ``1 - cos(h_l[t], h_{l+1}[t])``, the change block l makes to each token's hidden
  state (Mix-LN's ``block_influence``; 0 = the block does nothing).
- Learned scalars, where the architecture has them (one entry per block unless said):
  ``norm_alpha_attn`` / ``norm_alpha_mlp`` = DyT/Derf alpha, mean over that
  sublayer's DyT/Derf norms (input, output, post; for attention also the q/k/v norms);
  where a sublayer has more than one kind, each kind present in every block also gets its
  own list: ``norm_alpha_<site>_in`` / ``_out`` / ``_post`` / ``_qk`` (q/k/v norms' mean),
  e.g. Peri-LN's input and output norms, which drift apart in training;
  ``norm_shift_attn`` / ``norm_shift_mlp`` the same for Derf's shift (in general ``norm_<name>_<site>`` for
  each learned scalar a norm class declares in ``diag_scalars``, norm/norm_api.py; the per-position
  lists and the final/embedding entries for its first one);
  ``norm_alpha_final`` (scalar, the final norm's alpha), ``norm_alpha_embed`` (scalar,
  embedding norm), ``embed_scale`` (scalar, the DyT/Derf LLM recipe's embedding
  scalar); ``out_norm_gain_attn`` / ``out_norm_gain_mlp`` = mean gain of the output
  norm (Peri-LN, reordered, sandwich, sandwich_depth, NormFormer's attention; the effective gain
  1 + w where gains are stored so, ``arch.gain_offset``); nGPT: ``ngpt_alpha_attn`` /
  ``ngpt_alpha_mlp`` = mean |alpha| (the effective eigen learning rates), ``ngpt_sqk``,
  ``ngpt_suv`` = mean effective s_qk, s_uv, and ``ngpt_sz`` (scalar) = mean effective s_z.

Loss spikes (:class:`SpikeDetector`, any ``diag=``): a step whose training loss
exceeds ``diag.spike_factor`` x the median of the previous ``diag.spike_window``
losses (once at least min(10, window) are known) is a spike. ``summary.json`` and
every metrics record carry ``spikes``, the count so far; a record also carries
``spike_steps`` (the steps, numbered like ``step``) when spikes happened since the
previous record. The count and the loss window are in the checkpoint
(``spikes``, ``recent_losses``).

Cost: no hooks at all (the model's forward fills a ``hidden`` list only when
asked, and attention modules compute their statistics only while ``stats`` is
set); everything is gathered on the device and moved to the host in one transfer
per diagnostic step (``torch._foreach_norm`` for gradient and update norms);
``diag=off`` never calls any of it.
"""

from __future__ import annotations

import re
import statistics
from collections import deque

import torch
import torch.nn as nn

from normbench.model.kinds import is_norm

_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_NGPT_ATTN = ("c_attn", "att_c_proj", "attn_alpha", "sqk")


def _scalars(module) -> tuple[str, ...]:
    """The learned scalars a norm declares for the diagnostics (``diag_scalars``, norm/norm_api.py) that it
    holds: DyT's alpha, Derf's alpha and shift, a plugin norm's own."""
    if module is None or not is_norm(module):
        return ()
    return tuple(n for n in getattr(type(module), "diag_scalars", ()) if getattr(module, n, None) is not None)


def sublayer_of(name: str) -> str:
    """'attn' or 'mlp' for a parameter inside a block (GPT or nGPT naming)."""
    if ".attn." in name:
        return "attn"
    if ".mlp." in name:
        return "mlp"
    return "attn" if any(f".{k}." in name for k in _NGPT_ATTN) else "mlp"


class Gather:
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


def residual_stats(hidden: list[torch.Tensor], full: bool, g: Gather) -> None:
    """``*_resid`` statistics of the hidden states ``h_0 .. h_L`` (and, if ``full``, kurtosis and angular distance)."""
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


class SpikeDetector:
    """Loss spikes: a loss above ``factor`` x the median of the last ``window`` losses.

    Detection starts once min(10, window) losses are known; every loss (a spike
    too) then joins the window. ``steps`` collects the spike steps not yet
    reported (:meth:`pop_steps`). ``state_dict`` gives the checkpoint keys
    ``spikes`` and ``recent_losses``.
    """

    min_history = 10

    def __init__(self, factor: float, window: int):
        self.factor = float(factor)
        self.recent: deque = deque(maxlen=max(0, int(window)))
        self.count = 0
        self.steps: list[int] = []

    def update(self, loss: float, step: int | None = None) -> bool:
        spike = False
        if self.recent and len(self.recent) >= min(self.min_history, self.recent.maxlen):
            spike = loss > self.factor * statistics.median(self.recent)
        if spike:
            self.count += 1
            if step is not None:
                self.steps.append(step)
        self.recent.append(loss)
        return spike

    def pop_steps(self) -> list[int]:
        steps, self.steps = self.steps, []
        return steps

    def state_dict(self) -> dict:
        return {"spikes": self.count, "recent_losses": list(self.recent)}

    def load_state_dict(self, state: dict) -> None:
        self.count = int(state.get("spikes", 0))
        self.recent.clear()
        self.recent.extend(state.get("recent_losses", []))


class Diagnostics:
    def __init__(self, dcfg, model: nn.Module, batch: torch.Tensor):
        self.cfg, self.model = dcfg, model
        self.enabled = dcfg.name != "off"
        self.full = dcfg.name == "full"
        self.batch = batch  # (B, T+1) fixed held-out tokens
        self.n_layer = len(model.blocks)
        names, layer, sub = [], [], []
        self.params: list[nn.Parameter] = []  # block parameters
        self.other: list[nn.Parameter] = []  # everything else (embeddings, final norm, head)
        for name, p in model.named_parameters():
            m = _BLOCK.match(name)
            if m is None:
                self.other.append(p)
                continue
            names.append(name)
            self.params.append(p)
            layer.append(int(m.group(1)))
            sub.append(sublayer_of(name))
        self.names = names
        self.layer_index = torch.tensor(layer, dtype=torch.long)
        self.sub_index = torch.tensor([0 if s == "attn" else 1 for s in sub], dtype=torch.long)
        self._before: list[torch.Tensor] | None = None
        self._pending = Gather()
        self._on_device: dict = {}  # device -> (layer_index, sub_index, batch): copied once, not every step

    def _device_tensors(self, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Index tensors and the fixed batch on ``device`` (a blocking host-to-device copy only the first time)."""
        key = str(device)
        if key not in self._on_device:
            self._on_device[key] = tuple(t.to(device) for t in (self.layer_index, self.sub_index, self.batch))
        return self._on_device[key]

    # --- around the optimizer step ---
    @staticmethod
    def _norms_sq(params: list[nn.Parameter], device) -> torch.Tensor:
        """Squared gradient norms, one per parameter (zero without a gradient)."""
        zero = torch.zeros((), device=device)
        grads = [p.grad if p.grad is not None else zero for p in params]
        return torch.stack(torch._foreach_norm(grads)).float().pow(2)

    def grad_norms(self) -> None:
        """Per-layer and per-sublayer gradient norms; call before clipping."""
        if not self.params:
            return
        device = self.params[0].device
        norms_sq = self._norms_sq(self.params, device)
        layer, sub, _ = self._device_tensors(device)
        per_layer = torch.zeros(self.n_layer, device=device).index_add_(0, layer, norms_sq)
        per_sub = torch.zeros(2 * self.n_layer, device=device).index_add_(0, layer * 2 + sub, norms_sq)
        self._pending.add("grad_norm_layer", per_layer.sqrt())
        self._pending.add("grad_norm_attn", per_sub[0::2].sqrt())
        self._pending.add("grad_norm_mlp", per_sub[1::2].sqrt())
        if self.other:
            self._pending.add("grad_norm_other", self._norms_sq(self.other, device).sum().sqrt())

    def before_step(self) -> None:
        self._before = [p.detach().clone() for p in self.params]

    def after_step(self) -> None:
        if self._before is None or not self.params:
            return
        delta = torch._foreach_sub([p.detach() for p in self.params], self._before)
        d_sq = torch.stack(torch._foreach_norm(delta)).float().pow(2)
        p_sq = torch.stack(torch._foreach_norm(self._before)).float().pow(2)
        layer = self._device_tensors(d_sq.device)[0]
        d_layer = torch.zeros(self.n_layer, device=d_sq.device).index_add_(0, layer, d_sq)
        p_layer = torch.zeros(self.n_layer, device=d_sq.device).index_add_(0, layer, p_sq)
        self._pending.add("update_ratio_layer", d_layer.sqrt() / p_layer.sqrt().clamp_min(1e-12))
        self._before = None

    # --- the fixed-batch forward ---
    def attention_modules(self) -> list[nn.Module]:
        """The module of each block that fills ``stats`` (GPT: ``Attention``; nGPT: the block)."""
        return [b.attn.core if hasattr(b, "attn") else b for b in self.model.blocks]

    @torch.no_grad()
    def collect(self) -> dict:
        """Everything for this diagnostic step, moved to the host in one transfer."""
        g, self._pending = self._pending, Gather()
        was_training = self.model.training
        attn = self.attention_modules() if self.full else []
        batch = self._device_tensors(next(self.model.parameters()).device)[2]
        hidden: list[torch.Tensor] = []
        self.model.eval()
        try:
            for mod in attn:
                mod.stats = {}
            logits, _ = self.model(batch[:, :-1], hidden=hidden)
            residual_stats(hidden, self.full, g)
            g.add("logit_maxabs", logits.detach().float().abs().amax())
            if attn:
                g.add("attn_entropy", torch.stack([m.stats["attn_entropy"] for m in attn]))
                g.add("attn_logit_max", torch.stack([m.stats["attn_logit_max"] for m in attn]))
        finally:
            for mod in attn:
                mod.stats = None
            self.model.train(was_training)
        self.learned_scalars(g)
        return g.result()

    def _site_scalars(self, g: Gather, blocks, site: str) -> None:
        """Per block: each declared norm scalar's mean over the sublayer's norms (``norm_<name>_<site>``), the
        first one also per position where positions differ, and the Output-norm gain's mean."""
        means: dict[str, list[torch.Tensor]] = {}
        gains: list[torch.Tensor] = []
        by_position: dict[str, list[torch.Tensor]] = {}
        for b in blocks:
            sub = getattr(b, site)
            positions = {"in": [sub.norm_in], "out": [sub.norm_out], "post": [sub.norm_post]}
            if site == "attn":
                positions["qk"] = [getattr(sub.core, k, None) for k in ("q_norm", "k_norm", "v_norm")]
            mods = []
            for pos, found in positions.items():
                found = [m for m in found if _scalars(m)]
                if found:
                    first = _scalars(found[0])[0]
                    by_position.setdefault(pos, []).append(
                        torch.stack([getattr(m, first).squeeze() for m in found]).mean()
                    )
                mods += found
            for name in _scalars(mods[0]) if mods else ():
                means.setdefault(name, []).append(torch.stack([getattr(m, name).squeeze() for m in mods]).mean())
            if sub.norm_out is not None and getattr(sub.norm_out, "weight", None) is not None:
                gains.append(sub.norm_out.weight.mean() + getattr(sub.norm_out, "unit_offset", 0.0))  # 1 + w
        for i, (name, vals) in enumerate(means.items()):
            if len(vals) == len(blocks):
                g.add(f"norm_{name}_{site}", torch.stack(vals))
                for pos, pos_vals in by_position.items() if i == 0 else ():
                    if len(by_position) > 1 and len(pos_vals) == len(blocks):  # sites that drift apart, apart
                        g.add(f"norm_{name}_{site}_{pos}", torch.stack(pos_vals))
        if gains and len(gains) == len(blocks):
            g.add(f"out_norm_gain_{site}", torch.stack(gains))

    def learned_scalars(self, g: Gather) -> None:
        """Norm scalars per site (the norms' ``diag_scalars``), nGPT alpha and s means, Output-norm gain means."""
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
            self._site_scalars(g, blocks, site)
        for key, mod in (
            ("final", getattr(self.model, "ln_f", None)),
            ("embed", getattr(self.model, "emb_norm", None)),
        ):
            if names := _scalars(mod):  # the first declared scalar (DyT/Derf: alpha)
                g.add(f"norm_{names[0]}_{key}", getattr(mod, names[0]).squeeze())
        scale = getattr(self.model, "emb_scale", None)
        if scale is not None:
            g.add("embed_scale", scale.scale.squeeze())
