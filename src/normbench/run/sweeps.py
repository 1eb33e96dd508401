"""Hydra callback: two sweeps started at the same time never share a sweep directory.

The default ``hydra.sweep.dir`` is ``outputs/multirun/<date>/<time with microseconds>``
(``conf/config.yaml``). Two sweeps that resolve ``${now:...}`` in the same microsecond
(many submissions from one script, several hosts on a shared filesystem) would get the
same directory and write into each other's job dirs. :class:`UniqueSweepDir` claims
the directory with an atomic ``mkdir`` before any job starts; if another sweep holds
it already, this sweep takes ``<dir>-1`` (``-2``, ...) instead. It does not depend on
the resolver: the claim is the filesystem's. An explicit ``hydra.sweep.dir=...``
(reusing a sweep dir on purpose, e.g. to resume its jobs) is left alone.

It also prints the sweep directory when the sweep starts and when it ends (with the
command that reports on it), so a newcomer never has to guess where the results went.
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
            print(f"sweep directory: {Path(str(sweep.dir)).resolve()}", flush=True)
            return  # chosen by the user
        wanted = Path(str(sweep.dir))
        got = claim(wanted)
        print(f"sweep directory: {got.resolve()}", flush=True)
        if got == wanted:
            return
        # the launcher re-composes each job from hydra.overrides.hydra: the new dir goes there too
        with read_write(config.hydra), open_dict(config.hydra):
            sweep.dir = str(got)
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir={_quote(str(got))}")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        where = Path(str(config.hydra.sweep.dir)).resolve()
        print(f"sweep directory: {where}  (report: python -m normbench report {where})", flush=True)
