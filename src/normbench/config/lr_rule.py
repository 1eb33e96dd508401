"""The recipe's learning rate carried to the model's width: ``optim.lr: auto`` (docs/init.md, "The learning rate").

The reference recipe is GPT-2 124M's as nanoGPT trains it: AdamW at ``optim.lr_ref`` 6e-4 with betas
(0.9, 0.95) at width ``optim.lr_ref_width`` 768. Adam's update is entrywise of size ~lr, so a hidden matrix's
effect on its output grows with its fan-in d; the 1/fan_in rule (the one ``model.init_std: auto`` follows for
the variance, and muP's Adam table for the hidden-matrix LR) keeps it at the reference's by an LR of
``lr_ref * lr_ref_width / d``: 7.2e-3 at d 64, 3.6e-3 at d 128, 6e-4 at d 768. It is rounded to 4 significant
digits so the number in a config, a summary and a claim's table is the same float (7.2e-3, not 0.0072000001).

Under ``model.param=mup``/``completep`` the scalar is the LR at d_base (``model.mup_base_width``), and muP
carries it from there: the hidden matrices get the same ``lr_ref * lr_ref_width / d`` as under SP, the
embedding, readout and vectors keep the d_base value (model/mup.py).

Only AdamW has the rule: Lion's sign update, Muon's orthogonalized one (``optim.lr`` in Muon's units), SGD's
raw gradient step and Adafactor's relative step size have LR scales of their own, and no published rule
carries GPT-2's AdamW LR to them, so ``auto`` is refused there in one line.
"""

from __future__ import annotations

from typing import Any

from normbench.errors import ConfigError

AUTO = "auto"
LR_REF, LR_REF_WIDTH = 6.0e-4, 768  # GPT-2 124M, nanoGPT: AdamW 6e-4 at d 768 (optim.lr_ref, optim.lr_ref_width)
CARRIED = ("adamw",)  # the optimizers whose LR the rule carries
NO_RULE = {
    "lion": "Lion's sign update is larger per entry than AdamW's (its paper sets lr 3-10x lower)",
    "muon": "optim.lr is in Muon's own units (0.02..0.1 on model=tiny), not AdamW's",
    "sgd": "SGD's step is the raw gradient's, with no scale shared with AdamW's",
    "adafactor": "Adafactor's step is relative, min(lr, 1/sqrt(t)) x RMS(p)",
}


def carried(lr_ref: float, ref_width: int, width: int) -> float:
    """``lr_ref * ref_width / width`` to 4 significant digits (7.2e-3 for 6e-4 from 768 to 64)."""
    return float(f"{lr_ref * ref_width / width:.4g}")


def scalar_width(mcfg: Any) -> int:
    """The width ``optim.lr`` applies at: d_base under muP (which carries it on), else ``model.d_model``."""
    return mcfg.mup_base_width if getattr(mcfg, "param", "sp") != "sp" else mcfg.d_model


def resolve(ocfg: Any, mcfg: Any) -> float:
    """``optim.lr`` as the number the optimizer is built with; ConfigError (one line) for ``auto`` where no
    rule carries the reference's LR, or for a value that is neither ``auto`` nor a number."""
    lr = ocfg.lr
    if lr != AUTO:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)):
            raise ConfigError(f"optim.lr={lr} is not allowed; choose auto or a number >= 0")
        return float(lr)
    if ocfg.name not in CARRIED:
        why = NO_RULE.get(ocfg.name, "it has no rule carrying AdamW's LR")
        raise ConfigError(
            f"optim.lr=auto carries GPT-2's AdamW LR to the width; optim={ocfg.name} has no such rule ({why}): "
            f"set optim.lr to a number (conf/optim/{ocfg.name}.yaml gives its measured range)"
        )
    return carried(ocfg.lr_ref, ocfg.lr_ref_width, scalar_width(mcfg))


def matrix_lr(cfg: Any) -> float:
    """The hidden matrices' peak LR as the optimizer will build it: ``optim.lr`` resolved, times muP's
    d_base/d for an Adam-like optimizer (model/mup.py; Muon's matrices keep theirs)."""
    lr, m = resolve(cfg.optim, cfg.model), cfg.model
    if getattr(m, "param", "sp") != "sp" and cfg.optim.name in ("adamw", "lion"):
        return float(f"{lr * m.mup_base_width / m.d_model:.4g}")
    return lr


def source(ocfg: Any, mcfg: Any) -> str:
    """Where the scalar came from: ``optim.lr=auto (6e-4 x 768/64)`` or ``optim.lr=0.001``."""
    if ocfg.lr != AUTO:
        return f"optim.lr={ocfg.lr:g}" if isinstance(ocfg.lr, (int, float)) else f"optim.lr={ocfg.lr}"
    return f"optim.lr=auto ({ocfg.lr_ref:g} x {ocfg.lr_ref_width}/{scalar_width(mcfg)})"


def kind_lrs(groups: list[tuple[list[str], float]]) -> dict[str, float | list[float]]:
    """{parameter kind: its LR} from (kinds of a group's tensors, the group's LR) pairs; a kind whose
    tensors sit in groups of different LRs (Muon's 2-D matrices beside AdamW's 1-D ones) gets the sorted list."""
    by_kind: dict[str, set[float]] = {}
    for kinds, lr in groups:
        for kind in kinds:  # 6 digits: a muP multiplier's product (6e-4 x 10.67 = 0.0063999999999999994) as 0.0064
            by_kind.setdefault(kind, set()).add(float(f"{lr:.6g}"))
    return {k: (min(v) if len(v) == 1 else sorted(v)) for k, v in sorted(by_kind.items())}


def record_kind_lrs(optimizer: Any, kinds: dict[str, str], params: dict) -> Any:
    """``optimizer`` (built) with ``kind_lrs`` set: {kind: peak LR} over its groups; ``kinds`` and ``params``
    by parameter name."""
    name_of = {id(p): n for n, p in params.items()}
    groups = [({kinds[name_of[id(p)]] for p in g["params"]}, g["lr"]) for g in optimizer.param_groups]
    optimizer.kind_lrs = kind_lrs(groups)
    return optimizer


def describe(lrs: dict, source: str) -> str:
    """The start-up line: ``lr: embed 0.0072, matrix 0.0072, norm_in 0.0072 (optim.lr=auto (6e-4 x 768/64))``."""
    shown = ", ".join(
        f"{k} {'/'.join(f'{x:.4g}' for x in v) if isinstance(v, list) else f'{v:.4g}'}" for k, v in lrs.items()
    )
    return f"lr: {shown} ({source}; peak, before the schedule)"


def flat_resolved(flat: dict) -> Any:
    """A flat config's ``optim.lr`` as a number when it is ``auto`` (the resume check compares numbers, so a
    run made at the number resumes under ``auto`` and back); other values as they are."""
    lr = flat.get("optim.lr")
    if lr != AUTO or flat.get("optim.name") not in CARRIED:
        return lr
    width = flat.get("model.mup_base_width") if flat.get("model.param", "sp") != "sp" else flat.get("model.d_model")
    return carried(flat.get("optim.lr_ref", LR_REF), flat.get("optim.lr_ref_width", LR_REF_WIDTH), width)


class WithLR:
    """``ocfg`` read with ``lr`` as the resolved number, for the optimizer builders (they read ``ocfg.lr``)."""

    def __init__(self, ocfg: Any, lr: float):
        self._ocfg, self.lr = ocfg, lr

    def __getattr__(self, name: str):
        return getattr(self._ocfg, name)
