"""A run directory read back, one way for every reader: the report (analysis/loading.py), export
(export/run.py), reproduce's layer-skip evaluation (claims/skip_eval.py) and W&B's resume.

:class:`RunReader` gives a run's config, overrides, summary, metrics records and layer-skip result,
each read once on first use. Anything may be missing or half-written (a sweep still running, a job
killed mid-write), so nothing here raises on a damaged file: a missing or unparsable config is
``{}``, overrides ``[]``, metrics the complete records with an integer ``step`` (a torn last line is
skipped), a ``summary.json`` that exists but cannot be parsed has status ``unreadable``
(:meth:`normbench.run.rundir.RunDir.read_summary`). Where each file lives is :class:`RunDir`'s.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import yaml

from normbench.run.metrics import read_jsonl
from normbench.run.rundir import RunDir


def load_yaml(path: Path):
    """A YAML file's content; None when it is missing or not YAML."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def read_metrics(path: Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` with an integer ``step``, in file order; ``[]`` if it is missing."""
    try:
        records = read_jsonl(Path(path))
    except OSError:
        return []
    return [r for r in records if type(r.get("step")) is int]


class RunReader:
    """One run directory, read back (module docstring)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.dir = RunDir(self.path)

    @cached_property
    def config(self) -> dict:
        """``.hydra/config.yaml`` as plain data; ``{}`` when missing or damaged."""
        cfg = load_yaml(self.dir.config_path)
        return cfg if isinstance(cfg, dict) else {}

    @cached_property
    def overrides(self) -> list[str]:
        """The command-line overrides Hydra saved (``.hydra/overrides.yaml``); ``[]`` when none."""
        ovr = load_yaml(self.dir.overrides_path)
        return [str(o) for o in ovr] if isinstance(ovr, list) else []

    @cached_property
    def summary(self) -> dict | None:
        """``summary.json``; None when there is none (damaged: status ``unreadable``, never ``failed``)."""
        return self.dir.read_summary()

    @cached_property
    def metrics(self) -> list[dict]:
        return read_metrics(self.dir.metrics_path)

    @property
    def live(self) -> bool:
        """Whether a live process holds the run's ``.lock`` (asked anew each time)."""
        return self.dir.owner_alive()

    @property
    def checkpoint_path(self) -> Path:
        return self.dir.checkpoint_path

    def layer_skip(self) -> dict | None:
        """``layer_skip.json`` (claims/skip_eval.py); None when there is none or it cannot be read."""
        try:
            return json.loads(self.dir.layer_skip_path.read_text())
        except (OSError, ValueError):
            return None

    def downstream(self) -> dict | None:
        """``eval.json`` (run/eval_file.py); None when there is none or it cannot be read."""
        try:
            data = json.loads(self.dir.eval_path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def typed_config(self, fallback: dict | None = None):
        """The run's config over the schema (keys added since fill in with their defaults), from
        ``.hydra/config.yaml``, else from ``fallback`` (a checkpoint's flat config); None when neither
        exists. A key this version does not know leaves the run's own config as it is."""
        from omegaconf import OmegaConf  # deferred (start-up time): omegaconf

        from normbench.config.schema import Config  # deferred (start-up time): hydra, omegaconf

        if self.dir.config_path.is_file():
            loaded = OmegaConf.load(self.dir.config_path)
        elif isinstance(fallback, dict):
            loaded = OmegaConf.from_dotlist([])
            for key, value in fallback.items():
                OmegaConf.update(loaded, key, value, force_add=True)
        else:
            return None
        try:
            return OmegaConf.merge(OmegaConf.structured(Config), loaded)
        except Exception:  # a key this version does not know: the run's own config as is
            return loaded
