"""What each ``arch=`` name declares about itself: :class:`ArchTraits`, keyed by the name.

An arch declares its traits where it registers (model/placement.py ``register_placement``, model/ngpt.py
``register_arch``); every module that needs to know something of an arch reads them here and never
compares the arch's name. They sit in the config layer, beside the norms' own keys (norm_keys.py), so
that the layers below the model (a norm's ``check``) can read them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ArchTraits:
    """What the rest of normbench asks of an ``arch=`` name, declared where the arch registers (model/placement.py
    ``register_placement``, :func:`register_arch`): other modules read these, never the name.

    Each field is one question some module asks; the comment says which module and why.
    """

    # model.model_class: the module class that builds it (gpt | ngpt | simplegpt | normfree; model/__init__.py),
    # and model/combinations.py runs that class's own combination checks
    model: str = "gpt"
    # combinations: its blocks are defined by the norms it places, so norm=none is refused (Pre-LN without norms is
    # pre_ln norm=none; the norm-free and SimpleNorm archs check the norm themselves)
    needs_norm: bool = True
    # combinations: it builds no norm= layer (nGPT's L2 projection, the norm-free nets), so norm= is noted as
    # ignored and the norm.* checks have nothing to check
    ignores_norm: bool = False
    # weights and hidden states live on the unit sphere (nGPT): optim/optimizers.py decays nothing (the weights
    # are renormalized each step), model/stabilizers.py refuses QK-Clip (q, k are L2-normalized), the model card
    # names its norm L2
    unit_norm_geometry: bool = False
    # model/mup.py: why muP/CompleteP do not apply (its model class sets every weight by its own rule)
    own_init: str | None = None
    # model/gpt.py _init_weights: xavier-normal init with DeepNorm's gain beta on v, out-projection and FFN
    deepnorm_init: bool = False
    # combinations: it initialises the norm gains (what, for the refusal), so the norm needs a gain vector
    gain_init: str | None = None
    # combinations: what norm.affine=false removes of its paper's recipe (noted)
    learned_gains: str | None = None
    # combinations: why arch.final_norm=false is refused (its paper always applies the final norm)
    keeps_final_norm: str | None = None
    # combinations: the arch.scaled_init=true note (its authors advise against depth-scaled init)
    scaled_init_advice: str | None = None
    # combinations, CRMSNorm.check: every block places per-head q/k/v norms of norm= whatever arch.qk_norm says
    # (HybridNorm), so arch.qk_norm adds nothing (noted) and a norm that needs a residual input is refused
    qkv_norms: bool = False
    # model/stabilizers.py: q and k always pass a norm after W_q/W_k, which would undo QK-Clip's rescale
    qk_normed: bool = False
    # combinations: the arch.* keys only it reads; under any other arch a value set there is noted as ignored
    own_keys: tuple[str, ...] = ()
    # model/normfree.py multiplies the embedding by sqrt(d) (Fixup, T-Fixup), so combinations refuses model.fixnorm
    sets_embed_scale: bool = False
    # runtime/memory.py: d-wide norm sites per layer beyond Pre-LN's two (each saves input and output for backward)
    extra_norms: int = 0
    # runtime/memory.py: a d_ff-wide norm inside the MLP after the activation (NormFormer), saved likewise
    mid_norm: bool = False
    # runtime/memory.py: the MLP its model always builds, whatever model.mlp says (nGPT: swiglu)
    own_mlp: str | None = None


# ``arch=`` names (placements and own models) -> what each declares
ARCH_TRAITS: dict[str, ArchTraits] = {}


def register_arch(name: str, **traits: Any) -> ArchTraits:
    """Declare ``arch=name`` and its :class:`ArchTraits` (an arch without a placement: nGPT)."""
    ARCH_TRAITS[name] = ArchTraits(**traits)
    return ARCH_TRAITS[name]


def arch_traits(name: str) -> ArchTraits:
    """What ``arch=name`` declared; a name no arch declared (validation refuses it) declares nothing and needs
    no norm."""
    return ARCH_TRAITS.get(name, ArchTraits(needs_norm=False))
