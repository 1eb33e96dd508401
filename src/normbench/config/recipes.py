"""Values an architecture forces whatever the config says, as data (nGPT: no warmup, no weight decay).

The one validation pass (normbench.validation.validate) applies them to the config before any check
(:func:`apply_recipe`), so nothing is refused that the run would ignore, and the typed config the
run trains with holds what it computes. run/resume.py compares checkpoints under them
(:func:`recipe_values`): a checkpoint made before they were applied still holds the values given.
"""

from __future__ import annotations

from typing import Any

# arch -> {key: (forced value, the note when the config said otherwise)}; ``{value}``: the config's value
RECIPES: dict[str, dict[str, tuple[Any, str]]] = {
    "ngpt": {
        "sched.warmup_steps": (
            0,
            "arch=ngpt trains without warmup, as its reference: sched.warmup_steps={value} ignored",
        ),
        "optim.weight_decay": (0.0, "arch=ngpt uses no weight decay anywhere (optim.weight_decay={value} ignored)"),
    },
}


def recipe_values(arch: str | None) -> dict[str, Any]:
    """The keys ``arch`` forces, with their values."""
    return {key: value for key, (value, _) in RECIPES.get(arch or "", {}).items()}


def apply_recipe(cfg) -> list[str]:
    """Set the values the arch forces in ``cfg`` (in place); a note for each one the config set otherwise."""
    notes = []
    for key, (value, note) in RECIPES.get(cfg.arch.name, {}).items():
        section, name = key.split(".")
        node = getattr(cfg, section)
        old = getattr(node, name)
        if old != value:
            shown = "null (10% of the run)" if old is None and key == "sched.warmup_steps" else old
            notes.append(note.format(value=shown))
            setattr(node, name, value)
    return notes
