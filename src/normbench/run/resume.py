"""The resume policy: which config keys a checkpoint may be resumed with.

A resume refuses a checkpoint made with different model keys (they define the
weights), allows the keys that do not change the computation, and allows any
other key only when ``trainer.resume_allow_changed`` names it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from normbench.config.lr_rule import flat_resolved
from normbench.config.norm_keys import old_run_values
from normbench.config.recipes import recipe_values
from normbench.config.schema import as_dict, init_std_of, qk_norm_mode, upgrade_legacy
from normbench.errors import ConfigError

# Keys that define the model: a checkpoint can never be resumed with these changed.
MODEL_KEYS = ("model", "arch", "norm", "data.name", "data.tokenizer", "data.vocab_size", "data.paths", "data.hf_path")
# Overrides that say how a job runs, not what it computes, listed once: left out of job dir names
# (conf/config.yaml's hydra.job.config.override_dirname.exclude_keys, which a test holds equal to this,
# and reproduce's sweeps), W&B run names and the report's groups, and free to change on resume.
BOOKKEEPING_KEYS = ("trainer.resume", "trainer.resume_allow_changed", "logger", "logger.wandb.mode")
# Keys that may always differ on resume (they do not change the computation).
FREE_KEYS = (
    *BOOKKEEPING_KEYS,
    "trainer.log_every",
    "trainer.eval_every",
    "trainer.ckpt_every",
    "trainer.ckpt_every_s",
    "trainer.ckpt_async",
    "trainer.activation_checkpointing",  # recomputed activations: the same numbers (dropout's RNG replayed)
    "trainer.save_at",  # which checkpoints are kept as copies: the duration ladder's branch points
    "data.cache_dir",
    "data.workers",  # how many processes tokenize: the shards do not depend on it
    "device",
    "diag.every",
    "parallel",  # how, not what: checkpoints are full state dicts, resumable under any world size
    "compile",
    "peak_flops",
    "trainer.stop_grace_s",
    "trainer.skip_memory_check",
    "eval",  # in-training downstream scores (downstream/callback.py): read the model, never change it
)


def flat_config(cfg) -> dict:
    out = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node

    walk(as_dict(cfg), "")
    return out


# Keys added after runs were made, with the value that computes what those runs computed: a
# checkpoint without the key resumes under that value (and only under it). A callable gets the new
# run's flat config (the old value can depend on, e.g., the norm). The ``norm.*`` keys' values are
# declared by their owners (config/norm_keys.py ``OLD_RUNS``; a plugin norm's keys: their defaults).
_ADDED_KEYS: dict[str, object] = {
    "arch.attn_gate": "none",
    "arch.scale_resids": False,
    "arch.gain_offset": False,
    "arch.dssn_c_attn": None,
    "arch.dssn_c_mlp": None,
    "arch.tiny_init": False,
    "model.fixnorm": False,
    "optim.qk_clip": False,
    "optim.qk_clip_tau": 100.0,
    "trainer.tokens_per_param": None,
    "trainer.save_at": [],
    "model.param": "sp",  # model/mup.py: runs before it were the standard parametrization
    "model.mup_base_width": 64,
    "model.mup_base_depth": 2,
    "model.mup_head_dim": 16,
    "optim.mup_decay": "width",
    "optim.mup_eps": "fixed",
    "optim.lr_ref": 6.0e-4,  # config/lr_rule.py: read only under optim.lr=auto, which no older run had
    "optim.lr_ref_width": 768,
    "attn_fp32": False,  # model/attention.sdpa: runs before it ran the attention kernel in the autocast dtype
    # data/pipeline (documents with end-of-text, held-out documents): the built-in corpora are as they were;
    # an older data=files/hf run's tokens are not (the vocab grew by the end-of-text id: its checkpoint is
    # refused in one line as not fitting the model)
    "data.val_paths": [],
    "data.hf_val_split": None,
    "data.hf_streaming": False,
    "data.shard_tokens": 100_000_000,
    "data.train": None,
    "data.val": None,
    "data.mix": [],
}


def added_keys() -> dict[str, object]:
    """:data:`_ADDED_KEYS` and every registered norm keys class's values for old runs."""
    return {**_ADDED_KEYS, **old_run_values()}


def __getattr__(name: str):  # ADDED_KEYS: read when asked (a plugin norm may register keys later)
    if name == "ADDED_KEYS":
        return added_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _canonical(flat: dict) -> dict:
    """Old spellings in their current form: a boolean ``arch.qk_norm`` (true -> head, false -> none);
    ``norm.width_init`` as the ``model.init_std`` it computed (config.upgrade_legacy); ``model.init_std:
    auto`` and ``optim.lr: auto`` as the numbers they resolve to, so an old run made at those numbers
    resumes under ``auto``; the values the arch forces (config/recipes.py: nGPT's warmup and weight decay),
    which a checkpoint made before they were applied to the config still holds as given; ``precision: auto`` as
    the precision it resolves to here (fp32 on CPU: the runs made before it was the default resume under it)."""
    from normbench.config.spec import device_type, resolve_precision  # deferred (start-up time): torch

    out = upgrade_legacy(flat)
    out.update({k: v for k, v in recipe_values(out.get("arch.name")).items() if k in out})
    if "model.init_std" in out and "model.d_model" in out:
        out["model.init_std"] = init_std_of(out["model.init_std"], out["model.d_model"])
    if "arch.qk_norm" in out:
        out["arch.qk_norm"] = qk_norm_mode(out["arch.qk_norm"])
    if "optim.lr" in out:
        out["optim.lr"] = flat_resolved(out)
    if out.get("precision") == "auto":  # the default since issue 51: as this machine resolves it (config/spec.py)
        on_cuda = device_type(SimpleNamespace(device=out.get("device", "auto"))) == "cuda"
        out["precision"] = resolve_precision("auto", on_cuda)[0]
    return out


def config_diff(old: dict, new: dict) -> list[str]:
    old, new = _canonical(old), _canonical(new)
    added = {k: v(new) if callable(v) else v for k, v in added_keys().items() if k in new and k not in old}
    old = {**added, **old}
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def _changes(keys: list[str], old: dict, new: dict) -> str:
    """``key (checkpoint -> now)`` for the first few keys, one line."""
    shown = ", ".join(f"{k} ({_short(old.get(k, '<absent>'))} -> {_short(new.get(k, '<absent>'))})" for k in keys[:6])
    return shown + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")


def _short(value) -> str:
    text = str(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."


def check_resume_config(old: dict, new: dict, allowed: list[str], path: Path) -> list[str]:
    """The keys that differ from the checkpoint's config; ConfigError if any may not (one line, names them)."""
    diff = [k for k in config_diff(old, new) if not any(k == f or k.startswith(f + ".") for f in FREE_KEYS)]
    model_diff = [k for k in diff if any(k == m or k.startswith(m + ".") for m in MODEL_KEYS)]
    if model_diff:
        raise ConfigError(
            f"checkpoint {path} was made with a different model: {_changes(model_diff, old, new)} "
            "(model keys can never change on resume; use a new run directory)"
        )
    refused = [k for k in diff if "all" not in allowed and not any(k == a or k.startswith(a + ".") for a in allowed)]
    if refused:
        raise ConfigError(
            f"checkpoint {path} was made with a different config: {_changes(refused, old, new)} "
            f"(allow with trainer.resume_allow_changed=[{','.join(refused[:8])}])"
        )
    return diff
