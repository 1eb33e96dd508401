"""Further placements from the papers: LNS, OLMo 2's reordered norm, sandwich (Gemma), depth-scaled
sandwich (Pangu Ultra) and NormFormer. Each is one placement spec (model/placement.py) and one
``conf/arch/<name>.yaml``; equations and deviations in docs/architectures.md §3.9 to §3.13.

For a sublayer function f (attention A, MLP F), block index l = 1..L:

- ``lns``: LayerNorm Scaling, "The Curse of Depth in LLMs" (Sun et al. 2025, arXiv:2502.05795;
  lmsdss/LayerNorm-Scaling ``modeling_llama.py``, the LNS branch; allenai/OLMo-core
  ``LayerNormScaledTransformerBlock``): ``h = x + A(N(x)/sqrt(l)); x' = h + F(N(h)/sqrt(l))``, the same
  1/sqrt(l) for both sublayers of block l, the final norm unscaled; no new parameters. The constant is a
  Python float (the OLMo-core port's buffer is wiped by ``to_empty``). Plain N(0, 0.02) init, no
  depth-scaled init (the repo's README: do not combine the two). The reference at HEAD compares a
  lower-cased env var against ``'LNS'`` and so never runs its LNS branch; we follow the paper's equation.
- ``reordered``: OLMo 2 (OLMo et al. 2024, arXiv:2501.00656; allenai/OLMo-core
  ``ReorderedNormTransformerBlock``, transformers ``Olmo2DecoderLayer``): ``h = x + N(A(x));
  x' = h + N(F(h))``, no norm on any sublayer input, QK-norm over the whole width
  (``arch.qk_norm=width``), a final norm; no depth-scaled init. Deviation: OLMo-core draws weights from a
  normal truncated at 3 std; we use the plain normal (0.27% of draws differ).
- ``sandwich``: Gemma 2/3 (google/gemma_pytorch ``Gemma2DecoderLayer``): input and output norm on each
  sublayer, ``h = x + N_out(A(N_in(x)))``, final norm, every gain stored as ``1 + w`` with w = 0 at init
  (``arch.gain_offset``, :func:`~normbench.norm.norms.offset_gain`). Not part of it here: Gemma's
  sqrt(d) embedding multiplier, logit soft-caps and ``query_pre_attn_scalar`` (model choices, not norm
  placement); Gemma 3's per-head QK-norm is ``arch.qk_norm=head``. Gemma multiplies the gain in fp32
  before casting back; normbench casts first (identical in fp32).
- ``sandwich_depth``: depth-scaled sandwich norm (Pangu Ultra, arXiv:2504.07866). **Paper only: no
  reference code exists.** The sandwich topology with plain gains; the output-norm gains start at
  c/sqrt(L) (``arch.dssn_c_attn`` = 0.283, ``arch.dssn_c_mlp`` = 0.432, the values a secondary note on
  the paper quotes; low confidence) and stay learnable. ``arch.tiny_init=true`` adds the paper's TinyInit:
  weights N(0, 1/(2dL)) read as a variance, embedding std 0.5.
- ``normformer``: NormFormer (Shleifer et al. 2021, arXiv:2110.09456; facebookresearch/fairseq flags
  ``--scale-attn --scale-fc --scale-heads [--scale-resids]``): Pre-LN plus a learned scale per head
  (init 1), a norm on the attention output before the residual add, a norm over d_ff after the FFN
  activation, and with ``arch.scale_resids`` a learned vector lambda (init 1) on the FFN residual,
  ``x' = lambda * h + F(h)``. Deviation from fairseq (the author's issue #3973 says the two differ):
  the head scale acts on each head before the out-projection, as the paper writes it; fairseq scales
  the projected output (and its bias). The extra norms are the configured ``norm=`` (fairseq: LayerNorm).
"""

from __future__ import annotations

import math

from normbench.model.placement import PERI, BlockSpec, SublayerSpec, qk_kwargs, register_placement

# Pangu Ultra's output-norm gain constants c (attention, MLP), as a secondary note on the paper quotes them.
DSSN_C = (0.283, 0.432)


def lns_scale(block: int) -> float:
    """LNS's factor for 0-based block index ``block``: 1/sqrt(l) with l = block + 1."""
    return 1.0 / math.sqrt(block + 1)


@register_placement("lns", scaled_init_advice="the LNS authors advise against depth-scaled init")
def _lns(arch, n_layer: int) -> list[BlockSpec]:
    specs = []
    for i in range(n_layer):
        sub = SublayerSpec(in_norm=True, in_scale=lns_scale(i))
        specs.append(BlockSpec(sub, sub, **qk_kwargs(arch)))
    return specs


@register_placement("reordered")
def _reordered(arch, n_layer: int) -> list[BlockSpec]:
    out = SublayerSpec(out_norm=True)
    return [BlockSpec(out, out, **qk_kwargs(arch))] * n_layer


@register_placement("sandwich", extra_norms=2)
def _sandwich(arch, n_layer: int) -> list[BlockSpec]:
    return [BlockSpec(PERI, PERI, **qk_kwargs(arch))] * n_layer


def dssn_gains(arch, n_layer: int) -> tuple[float, float]:
    """Initial output-norm gains (attention, MLP): c / sqrt(L)."""
    c_attn = arch.dssn_c_attn if arch.dssn_c_attn is not None else DSSN_C[0]
    c_mlp = arch.dssn_c_mlp if arch.dssn_c_mlp is not None else DSSN_C[1]
    return c_attn / math.sqrt(n_layer), c_mlp / math.sqrt(n_layer)


@register_placement(
    "sandwich_depth",
    gain_init="initialises the output-norm gains to c/sqrt(L)",
    extra_norms=2,
    own_keys=("dssn_c_attn", "dssn_c_mlp"),
)
def _sandwich_depth(arch, n_layer: int) -> list[BlockSpec]:
    g_attn, g_mlp = dssn_gains(arch, n_layer)
    attn = SublayerSpec(in_norm=True, out_norm=True, out_gain=g_attn)
    mlp = SublayerSpec(in_norm=True, out_norm=True, out_gain=g_mlp)
    return [BlockSpec(attn, mlp, **qk_kwargs(arch))] * n_layer


# NormFormer: the attention-output norm (d) beyond Pre-LN's two, and the FFN norm over d_ff
@register_placement("normformer", extra_norms=1, mid_norm=True, own_keys=("scale_resids",))
def _normformer(arch, n_layer: int) -> list[BlockSpec]:
    mlp = SublayerSpec(in_norm=True, mid_norm=True, resid_scale=bool(arch.scale_resids))
    return [BlockSpec(PERI, mlp, head_scale=True, **qk_kwargs(arch))] * n_layer
