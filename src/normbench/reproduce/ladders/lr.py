"""The LR ladder: one claim at several step sizes, so a verdict shows whether it belongs to the setting or to the LR.

A claim is judged at one LR (the recipe's, carried to the width: ``optim.lr=auto``, docs/init.md). Some
verdicts flip when that LR moves (issue 46: ``peri_variance``'s variance half at 1e-3 against 5.66e-3), others
only change their size. ``normbench reproduce ID lr=ladder`` runs the claim's sweep (its fixed overrides,
seeds and tests) at about 1/3x, 1x and 3x the claim's LR and writes ``<out>/<id>/lr_ladder.json`` (each rung's
LR, verdict, effect and interval per test) and ``lr_ladder.png`` (the effect against the LR, log x, with the
intervals, the threshold or band and zero).

Here is only the rule, :func:`ladder`: the rungs' LRs, overrides and directories; :mod:`.rungs` runs them.
Each rung is an ordinary ``reproduce`` call with ``optim.lr=<number>`` added (its own settings hash, so it
resumes and is reused like any sweep); the 1x rung adds nothing, so it is the verdict's own sweep, reused
where it ran. A rung's LR is the claim's resolved ``optim.lr`` times the factor, to 4 significant digits
(7.2e-3 -> 2.4e-3 and 2.16e-2). A claim whose verdict is over an LR grid (it sweeps ``optim.lr``: the
largest-stable-LR claims) or at each side's own best LR (``tune: optim.lr``) has no one LR to move and is refused.
Under Muon the ladder moves ``optim.lr`` (the matrices'); the AdamW side's ``optim.adamw_lr`` stays.

Hand-written: a claim-level plan over ``reproduce`` calls, as every ladder's (reproduce/ladders/rungs.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from normbench.claims.registry import Claim
from normbench.config.spec import spec_of
from normbench.errors import ConfigError
from normbench.reproduce.ladders.rungs import Ladder, Rung, climb

if TYPE_CHECKING:
    from normbench.reproduce.plan import Plan
    from normbench.reproduce.request import Request

FACTORS = (1 / 3, 1.0, 3.0)
NAME = "lr_ladder"


def refusal(claim: Claim, scale: str, overrides=()) -> str | None:
    """Why the claim cannot have an LR ladder at ``scale`` (one line), or None."""
    if any(t.tune == "optim.lr" for t in claim.tests):
        return (
            f"claim {claim.id} judges each side at its own best optim.lr (tune: optim.lr), so it has no one LR "
            "for lr=ladder to move"
        )
    if any("optim.lr" in grid for grid in claim.grids(scale)):  # the claim's own grids, whatever the user sets
        return (
            f"claim {claim.id} sweeps optim.lr (its verdict is read off an LR grid), so it has no one LR for "
            "lr=ladder to move; its grid is its LR ladder"
        )
    return None


def claim_lr(claim: Claim, scale: str, overrides=(), cfg=None) -> tuple[float, str]:
    """(the LR the claim's jobs train at, where it came from), from a composed job of the claim (``cfg``: one
    of its plan's, else its fixed settings composed)."""
    from normbench.reproduce.shared import compose  # deferred (start-up time): hydra, numpy

    if cfg is None:
        cfg = compose(claim, claim.settings(scale, overrides), "(fixed settings)")
    spec = spec_of(cfg)
    return spec.lr, spec.lr_source


def rung_lrs(center: float, factors=FACTORS) -> list[tuple[float, float]]:
    """[(factor, LR)]: ``center`` times each factor, 4 significant digits (the 1x rung is ``center`` itself)."""
    return [(f, center if f == 1.0 else float(f"{center * f:.4g}")) for f in factors]


def _factor(f: float) -> str:
    return "1/3x" if abs(f - 1 / 3) < 1e-9 else f"{f:g}x"


def ladder(claim: Claim, req: Request, base: Plan) -> Ladder:
    """The claim's rungs of LR (:func:`rung_lrs` around the LR its composed jobs, ``base``, train at), each entry
    opening with its ``lr`` and ``factor``."""
    out = req.out
    center, source = claim_lr(claim, req.scale, list(req.overrides), cfg=base.pairs[0][1])
    if not center > 0:
        raise ConfigError(f"claim {claim.id}: optim.lr={center:g}; an LR ladder needs an LR > 0")
    plan = rung_lrs(center)
    rungs = []
    for factor, lr in plan:
        extra = () if factor == 1.0 else (f"optim.lr={lr:.4g}",)
        where = out if not extra else out / claim.id / NAME / f"lr{lr:.4g}"
        label = f"LR rung {lr:.4g} ({_factor(factor)} the claim's)"
        rungs.append(Rung(extra, where, label, {"lr": lr, "factor": round(factor, 4)}))
    return Ladder(
        NAME,
        rungs,
        header={"lr": center, "lr_source": source},
        plot={
            "x": "lr",
            "xlabel": "peak learning rate (optim.lr)",
            "log_base": 10,
            "title": f"effect against the learning rate (the claim's: {center:.4g})",
        },
        intro="LR ladder at "
        + ", ".join(f"{lr:.4g} ({_factor(f)})" for f, lr in plan)
        + f" of the claim's {center:.4g} ({source})",
    )


def run_lr_ladder(claim: Claim, req: Request, log=print) -> dict | None:
    """The claim's sweep at each rung's LR (the request's scale, seeds and overrides); lr_ladder.json and its
    figure (None on a dry run). A claim with no one LR to move (:func:`refusal`) is refused before any composing."""
    if why := refusal(claim, req.scale, list(req.overrides)):
        raise ConfigError(why)
    return climb(claim, req, ladder, log)
