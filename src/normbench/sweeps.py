"""Hydra callback: two sweeps started at the same time never share a sweep directory.

The default ``hydra.sweep.dir`` is ``outputs/multirun/<date>/<time with microseconds>``
(``conf/config.yaml``). Two sweeps that resolve ``${now:...}`` in the same microsecond
(many submissions from one script, several hosts on a shared filesystem) would get the
same directory and write into each other's job dirs. :class:`UniqueSweepDir` claims
the directory with an atomic ``mkdir`` before any job starts; if another sweep holds
it already, this sweep takes ``<dir>-1`` (``-2``, ...) instead. It does not depend on
the resolver: the claim is the filesystem's. An explicit ``hydra.sweep.dir=...``
(reusing a sweep dir on purpose, e.g. to resume its jobs) is left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def claim(path: Path, attempts: int = 1000) -> Path:
    """Create ``path`` (or the first free ``path-N``) atomically; return the one created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for i in range(attempts):
        candidate = path if i == 0 else path.with_name(f"{path.name}-{i}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"no free sweep directory next to {path}")


class UniqueSweepDir(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = config.hydra.sweep
        if "${now:" not in str(OmegaConf.to_container(sweep, resolve=False).get("dir")):
            return  # chosen by the user
        wanted = Path(str(sweep.dir))
        got = claim(wanted)
        if got == wanted:
            return
        # the launcher re-composes each job from hydra.overrides.hydra: the new dir goes there too
        with read_write(config.hydra), open_dict(config.hydra):
            sweep.dir = str(got)
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir={_quote(str(got))}")
