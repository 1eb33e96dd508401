"""Traits as declarations: every ``arch=`` and ``norm=`` name declares on its registry entry what the rest of
normbench asks of it (config/arch_traits.py ``ArchTraits``, norm/norm_api.py ``Norm``), and no code outside the
registries compares an arch's or a norm's name to a string literal to decide what to do.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from normbench.config.arch_traits import ARCH_TRAITS, ArchTraits, arch_traits
from normbench.config.schema import ArchConfig
from normbench.model import GPT, MODEL_CLASSES, NGPT, model_class
from normbench.model.combinations import MODEL_CHECKS
from normbench.model.placement import PLACEMENTS
from normbench.norm.norm_api import NORM_CLASSES, Norm, norm_class
from normbench.validation import archs, norms

from conftest import compose

SRC = Path(__file__).resolve().parent.parent / "src" / "normbench"

# Where an arch's name may be compared to a literal: the modules where archs register, whose code is
# those archs' own equations (normfree.py picks ReZero's, Fixup's or T-Fixup's among the three it defines).
ARCH_REGISTRY = (
    "model/placement.py",
    "model/norm_sites.py",
    "model/normfree.py",
    "model/simplegpt.py",
    "model/ngpt.py",
)
# Where a norm's name may be: the modules where norms register, and the keys they declare (SeeDNorm's
# values for old runs ask whether the run was SeeDNorm's own).
NORM_REGISTRY = ("norm/norm_api.py", "norm/norms.py", "norm/scale_and_batch_norms.py", "config/norm_keys.py")
# Out of scope for both: the figures' colours and labels, and the exported template, a package of its own
# that cannot import normbench (its ``kind`` values are its own config's vocabulary).
TEXT_ONLY = ("report/figures/", "claims/figure.py", "hf_template/")


def _literal(names) -> str:
    """A string literal, in either quote, holding exactly one of ``names``."""
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return rf"""(?:"(?:{alternatives})"|'(?:{alternatives})')"""


def comparison_pattern(names) -> re.Pattern:
    """``== "x"``, ``"x" !=``, ``in ("a", "x")`` / ``not in [..., 'x']`` (across lines) for a name in ``names``."""
    lit = _literal(names)
    return re.compile(rf"(?:==|!=)\s*{lit}|{lit}\s*(?:==|!=)|\bin\s*[(\[{{][^()\[\]{{}}]*?{lit}")


# ``"none"`` is also a value of arch.qk_norm, arch.attn_gate, parallel, ...: a comparison counts as one of a norm's
# name when the other side is a name (``norm``, ``norm_name``, ``<x>.name``, ``setting(r, "norm")``).
_NAMEISH = r"""(?:\bnorm|\bnorm_name|\.name|setting\([^()]*['"]norm['"]\))"""
_NONE = _literal(["none"])
NONE_PATTERN = re.compile(
    rf"{_NAMEISH}\s*(?:==|!=)\s*{_NONE}|{_NONE}\s*(?:==|!=)\s*[\w.]*{_NAMEISH}"
    rf"|{_NAMEISH}\s+(?:not\s+)?in\s*[(\[{{][^()\[\]{{}}]*?{_NONE}"
)


def name_comparisons(root: Path, arch_names, norm_names) -> list[str]:
    """``path:line: text`` of each comparison of an arch's or a norm's name to a literal under ``root``
    (normbench's package directory), outside the registries that may make them and the text-only modules."""
    arch_re, norm_re = comparison_pattern(arch_names), comparison_pattern(set(norm_names) - {"none"})
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(TEXT_ONLY):
            continue
        text = path.read_text()
        patterns = [] if rel in ARCH_REGISTRY else [arch_re]
        patterns += [] if rel in NORM_REGISTRY else [norm_re, NONE_PATTERN]
        for pattern in patterns:
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{rel}:{line}: {text.splitlines()[line - 1].strip()}")
    return sorted(set(found))


def test_every_arch_and_norm_declares_its_traits():
    assert set(archs()) == set(ARCH_TRAITS) and set(PLACEMENTS) <= set(ARCH_TRAITS)
    for name in archs():
        traits = arch_traits(name)
        assert isinstance(traits, ArchTraits), name
        assert traits.model in MODEL_CLASSES, name
        # mup.check names why muP does not apply to an arch with a model class of its own
        assert (traits.model != "gpt") == (traits.own_init is not None) == (traits.model in MODEL_CHECKS), name
        assert set(traits.own_keys) <= {f.name for f in dataclasses.fields(ArchConfig)}, name
    with pytest.raises(dataclasses.FrozenInstanceError):
        arch_traits("pre_ln").needs_norm = True
    for name in norms():
        assert name in NORM_CLASSES and issubclass(norm_class(name), Norm), name
        assert isinstance(norm_class(name).identity, bool), name


def test_traits_the_papers_imply():
    ngpt = arch_traits("ngpt")
    # nGPT (Loshchilov et al. 2024): every vector on the unit sphere by L2 projection, no norm layer of norm=
    assert ngpt.unit_norm_geometry and ngpt.ignores_norm and not ngpt.needs_norm and ngpt.own_mlp == "swiglu"
    assert [n for n in archs() if arch_traits(n).unit_norm_geometry] == ["ngpt"]
    # DeepNorm (Wang et al. 2022): alpha and beta are its own, and its init scales by beta
    assert arch_traits("deepnorm").own_keys == ("alpha", "beta") and arch_traits("deepnorm").deepnorm_init
    # HybridNorm (Zhuo et al. 2025): q/k/v norms in every block; Pre-LN without norms is pre_ln norm=none
    assert arch_traits("hybridnorm").qkv_norms and arch_traits("hybridnorm_star").qkv_norms
    assert not arch_traits("pre_ln").needs_norm and arch_traits("post_ln").needs_norm
    # ReZero keeps the embedding as drawn; Fixup and T-Fixup multiply it by sqrt(d)
    assert [n for n in ("rezero", "fixup", "tfixup") if arch_traits(n).sets_embed_scale] == ["fixup", "tfixup"]
    assert [n for n in norms() if norm_class(n).identity] == ["none"]


@pytest.mark.parametrize("name", ["pre_ln", "ngpt", "simplenorm", "fixup"])
def test_model_class_follows_the_declared_model(name):
    cls = model_class(compose([f"arch={name}"]))
    assert cls is MODEL_CLASSES[arch_traits(name).model]
    assert (cls is NGPT) == (name == "ngpt") and (cls is GPT) == (name == "pre_ln")


def test_the_pattern_catches_name_comparisons():
    arch_re, norm_re = comparison_pattern(["ngpt", "deepnorm"]), comparison_pattern(["dyt"])
    caught = [
        'if arch == "ngpt":',
        "x if a.name != 'ngpt' else y",
        'if arch in ("hybridnorm", "deepnorm"):',
        'a.name not in [\n    "x",\n    "deepnorm",\n]',
        '"ngpt" == cfg.arch.name',
    ]
    assert all(arch_re.search(s) for s in caught)
    assert norm_re.search('if cfg.norm.name == "dyt":')
    missed = ['f"arch={arch} ignores norm"', '"ngpt": {"eps": 1}', 'arch == "ngpt_like"', 'x = ("ngpt", 1)']
    assert not any(arch_re.search(s) for s in missed)
    none_caught = ['if norm != "none":', 'cfg.norm.name == "none"', 'setting(r, "norm") == "none"']
    none_missed = ['if qk != "none":', 'a.attn_gate != "none"', 'mode == "none"', 'name, x = "none", False']
    assert all(NONE_PATTERN.search(s) for s in none_caught)
    assert not any(NONE_PATTERN.search(s) for s in none_missed)


def test_no_code_outside_the_registries_compares_a_name():
    assert name_comparisons(SRC, archs(), norms()) == []
