"""Model FLOPs, device peaks, and MFU (model FLOPs utilization).

The estimate everybody quotes (Chowdhery et al. 2022, PaLM, appendix B; nanoGPT
``estimate_mfu``): training costs, per token,

    6 N  +  12 L d T

FLOPs, where N counts the parameters that take part in matrix multiplies (every
parameter except an embedding table that is only looked up: with tied
embeddings the shared matrix counts once, as the LM head; an untied input
embedding and a learned position table do not count), L layers, model width d
and context T. ``6N``: forward 2N, backward 4N; ``12 L d T``: the attention
scores and weighted sum (QK^T and AV, forward and backward), counted for the
full T x T square as PaLM and nanoGPT do (causal masking would halve it; the
convention keeps numbers comparable across papers). Norms, softmax, activations
and nGPT's normalizations are left out: MFU is about useful model FLOPs, not
the FLOPs the hardware happened to run.

MFU = FLOPs per token x tokens/s / (peak FLOP/s per device x devices). Peaks are
dense bf16 tensor-core numbers from the vendors' datasheets (no sparsity);
``peak_flops=`` in the config overrides the table (needed for an unknown GPU,
or to measure fp32 runs against a TF32 peak). On CPU there is no peak: MFU is
``None``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

# Dense bf16 peak FLOP/s per device (vendor datasheets, without sparsity).
PEAK_BF16_FLOPS: dict[str, float] = {
    "A100": 312e12,  # A100 SXM4 and PCIe, 40/80 GB
    "H100 SXM": 989e12,  # H100 SXM5 (torch reports e.g. "NVIDIA H100 80GB HBM3")
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H200": 989e12,  # H200 SXM and GH200: the H100 SXM compute die
}


def gpu_peak_flops(name: str) -> float | None:
    """Dense bf16 peak of a GPU from its ``torch.cuda.get_device_name`` string, None if unknown."""
    n = name.upper()
    if "H200" in n or "GH200" in n:
        return PEAK_BF16_FLOPS["H200"]
    if "H100" in n:
        if "PCIE" in n:
            return PEAK_BF16_FLOPS["H100 PCIe"]
        if "NVL" in n:
            return PEAK_BF16_FLOPS["H100 NVL"]
        return PEAK_BF16_FLOPS["H100 SXM"]
    if "A100" in n:
        return PEAK_BF16_FLOPS["A100"]
    return None


def peak_flops(device: torch.device, override: float | None = None) -> float | None:
    """Peak FLOP/s of one device: ``override`` if given, the table for a known GPU, else None (CPU)."""
    if override:
        return float(override)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return gpu_peak_flops(torch.cuda.get_device_name(device))


def matmul_params(model: nn.Module) -> int:
    """Parameters that take part in matrix multiplies: all but look-up-only embedding tables."""
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() deduplicates tied weights
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
    for m in model.modules():
        if isinstance(m, nn.Embedding) and id(m.weight) not in linear_weights and id(m.weight) in seen:
            total -= m.weight.numel()
            seen.discard(id(m.weight))
    return total


def flops_per_token(n_matmul_params: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: ``6 N + 12 L d T`` (PaLM appendix B, nanoGPT estimate_mfu)."""
    return 6.0 * n_matmul_params + 12.0 * n_layer * d_model * seq_len


def model_flops_per_token(model: nn.Module, mcfg) -> float:
    """:func:`flops_per_token` of a built model with its config's L, d and T."""
    return flops_per_token(matmul_params(model), mcfg.n_layer, mcfg.d_model, mcfg.seq_len)


def mfu(flops_per_tok: float, tokens_per_s: float | None, peak_per_device: float | None, devices: int = 1):
    """Model FLOPs utilization in [0, 1] (None without a peak or a throughput)."""
    if not peak_per_device or not tokens_per_s:
        return None
    return flops_per_tok * tokens_per_s / (peak_per_device * devices)


def peak_memory_gb(device: torch.device) -> float | None:
    """Peak GPU memory allocated by tensors on this device, in GB (1e9 bytes); None on CPU."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device) / 1e9
