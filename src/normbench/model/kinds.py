"""What each parameter is, declared by the module that owns it.

The weight-decay policy (``optim.decay_*``), the optimizer's param groups and the
diagnostics read a parameter's *kind* through :func:`param_kinds`, the one place that
decides it. A module declares the kinds of its own parameters with a class attribute
``PARAM_KINDS`` (own parameter name -> kind):

- ``matrix`` 2-D hidden weights, ``head`` the untied LM head, ``embed`` token/position
  embeddings, ``bias`` additive biases, ``scalar`` learned scalars and scale vectors
  (DyT/Derf alpha and shift, the embedding scale, nGPT's alpha and s);
- ``norm``: a norm layer's gain. Where the norm sits decides the final kind: ``norm_out``
  when its output is a sublayer output or the residual stream itself, else ``norm_in``.
  The module that places norms says which are on that side with a ``residual_side()``
  method (``Sublayer``: output norms, norms after the residual add, and an input norm
  whose output carries the residual, HybridNorm's FFN norm).

torch's ``nn.Linear`` and ``nn.Embedding`` cannot declare, so they get ``matrix``/``bias``
and ``embed`` -- except inside a norm (:func:`norm_internal`): a layer a norm builds for itself is the
norm's, so its parameters take the kind the norm declares for ``"<child>.<param>"`` (else ``norm``), are
decayed and grouped with the norm's, and the model's init leaves them as the norm built them.
A parameter of any other module without a declared kind is an error: a
new layer says what its parameters are instead of being guessed into a group. A tied
tensor (wte = lm_head) is one parameter, named and kinded where it appears first (``embed``).
"""

from __future__ import annotations

import torch.nn as nn

from normbench.norm.norm_api import Norm

KINDS = ("matrix", "head", "embed", "norm_in", "norm_out", "bias", "scalar")
DECLARABLE = ("matrix", "head", "embed", "norm", "bias", "scalar")
_TORCH = ((nn.Linear, {"weight": "matrix", "bias": "bias"}), (nn.Embedding, {"weight": "embed"}))


def own_kinds(module: nn.Module) -> dict[str, str]:
    """The kinds ``module`` declares for its own (non-recursive) parameters."""
    declared = getattr(type(module), "PARAM_KINDS", None)
    if declared is not None:
        return dict(declared)
    for cls, kinds in _TORCH:
        if isinstance(module, cls):
            return dict(kinds)
    return {}


def is_norm(module: nn.Module) -> bool:
    """A norm layer: a :class:`~normbench.norm.norm_api.Norm`, or a class that declares a ``norm`` gain
    (also when built without one, affine=False)."""
    return isinstance(module, Norm) or "norm" in own_kinds(module).values()


def norm_internal(model: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    """Modules strictly inside a norm layer: id -> (that norm, the module's name within it)."""
    inside: dict[int, tuple[nn.Module, str]] = {}
    for mod in model.modules():
        if is_norm(mod) and id(mod) not in inside:
            for name, child in mod.named_modules():
                if child is not mod:
                    inside[id(child)] = (mod, name)
    return inside


def param_kinds(model: nn.Module) -> dict[str, str]:
    """Each (deduplicated) parameter name of ``model`` -> its kind (one of :data:`KINDS`)."""
    residual = {id(m) for mod in model.modules() if hasattr(mod, "residual_side") for m in mod.residual_side()}
    inside = norm_internal(model)
    kinds: dict[str, str] = {}
    seen: set[int] = set()
    for mod_name, mod in model.named_modules():
        declared, side = own_kinds(mod), mod
        if id(mod) in inside:  # a layer the norm built for itself: the norm says what it is
            side, prefix = inside[id(mod)]
            norm_declared = own_kinds(side)
            declared = {p: norm_declared.get(f"{prefix}.{p}", "norm") for p, _ in mod.named_parameters(recurse=False)}
        for p_name, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            kind = declared.get(p_name)
            if kind not in DECLARABLE:
                raise ValueError(
                    f"parameter {name} of {type(mod).__name__} has no kind: give the class "
                    f"PARAM_KINDS = {{{p_name!r}: ...}} with one of {', '.join(DECLARABLE)}"
                )
            if kind == "norm":
                kind = "norm_out" if id(side) in residual else "norm_in"
            kinds[name] = kind
    return kinds
