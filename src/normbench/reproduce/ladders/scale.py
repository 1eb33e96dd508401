"""The scale ladder: one claim's sweep at several model sizes, so a verdict comes with its trend.

A claim judged at one tiny size says little about the papers' scale; how its effect moves with the
size says more. ``normbench reproduce ID ladder=true`` runs the claim's sweep (the same fixed
overrides, seeds and tests) at each rung, by default ``model.d_model`` 64, 128 and 256 with the
claim's own depth and LR. By default (``ladder_param=mup``) the rungs run under muP (``model.param=mup``,
model/mup.py, docs/mup.md) with the claim's own width as d_base and its d_head held (the head count grows),
so the LR the claim set at its own width transfers; ``ladder_param=sp`` is the standard parametrization with
the claim's heads, where the init follows the width (``model.init_std: auto``, docs/init.md) but the same
AdamW LR takes a larger effective step at every wider rung. A claim file can set its own rungs under
``scales.<scale>.ladder`` (a list of override lists, e.g. depth with width for a depth claim).

Here is only the rule, :func:`ladder`: the claim's size and the rungs' overrides, directories and sizes;
:mod:`.rungs` runs them. Each rung is an ordinary ``reproduce`` call with the rung's overrides (its own settings
hash, so it resumes and is reused like any claim sweep); the rung equal to the claim's own size is the claim's
own sweep. ``<out>/<id>/ladder.json`` holds each rung's verdict, effect and interval per test, and
``ladder.png`` draws the effect against the size with its interval, the threshold (or band) and zero
(under ``ladder_param=sp``: ``ladder_sp.json`` and ``ladder_sp.png``, and rung directories without ``-mup``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from normbench.claims.registry import Claim
from normbench.reproduce.ladders.rungs import Ladder, Rung, climb

if TYPE_CHECKING:
    from normbench.reproduce.plan import Plan
    from normbench.reproduce.request import Request

WIDTHS = (64, 128, 256)


def mup_overrides(width: int, base_width: int, head_dim: int) -> list[str]:
    """A rung's muP keys: d_base is the claim's own width, d_head its own (model/mup.py's rule)."""
    return [
        f"model.n_head={width // head_dim}",
        "model.param=mup",
        f"model.mup_base_width={base_width}",
        f"model.mup_head_dim={head_dim}",
    ]


def rungs(claim: Claim, scale: str, base_width: int) -> list[list[str]]:
    """The rungs' overrides: the claim's ``ladder`` if it has one, else the default widths; the rung at
    the claim's own width gets no override (it is the claim's own sweep)."""
    declared = claim.sweep(scale).ladder
    if declared is not None:
        return [list(r) for r in declared]
    return [[] if w == base_width else [f"model.d_model={w}"] for w in WIDTHS]


def _size(overrides: list[str], base: dict) -> dict:
    """d_model and n_layer a rung resolves to (its overrides over the claim's composed config)."""
    size = dict(base)
    for o in overrides:
        key, _, value = o.partition("=")
        if key in ("model.d_model", "model.n_layer"):
            size[key.split(".")[1]] = int(value)
    return size


def ladder(claim: Claim, req: Request, base: Plan) -> Ladder:
    """The claim's rungs of size (the request's scale and overrides, ``req.ladder_param``'s parametrization),
    each entry opening with its ``d_model`` and ``n_layer``. ``base``: unread, the sizes are the fixed settings'."""
    from normbench.reproduce.shared import compose  # deferred (start-up time): hydra, numpy

    scale, out, param = req.scale, req.out, req.ladder_param
    cfg = compose(claim, claim.settings(scale, req.overrides), "(fixed settings)")  # the size every rung starts from
    own = {"d_model": int(cfg.model.d_model), "n_layer": int(cfg.model.n_layer)}
    head_dim = own["d_model"] // int(cfg.model.n_head)
    tag = "-mup" if param == "mup" else ""
    sizes = []
    for rung in rungs(claim, scale, own["d_model"]):
        size = _size(rung, own)
        if param == "mup" and size["d_model"] != own["d_model"]:  # the claim's own width is muP's d_base: as sp
            rung = [*rung, *mup_overrides(size["d_model"], own["d_model"], head_dim)]
        where = out if not rung else out / claim.id / "ladder" / f"d{size['d_model']}-L{size['n_layer']}{tag}"
        label = f"ladder rung d_model {size['d_model']}, {size['n_layer']} blocks"
        sizes.append(Rung(tuple(rung), where, label, size))
    return Ladder(ladder_name(param), sizes, header={"param": param})


def run_ladder(claim: Claim, req: Request, log=print) -> dict | None:
    """The claim's sweep at each rung (the request's scale, seeds and overrides, ``req.ladder_param``'s
    parametrization); ladder.json and its figure (None on a dry run)."""
    return climb(claim, req, ladder, log)


def ladder_name(param: str) -> str:
    """The ladder's file stem: ``ladder`` under muP (the default), ``ladder_sp`` under SP."""
    return "ladder" if param == "mup" else f"ladder_{param}"
