"""Where the config files are and how they compose: ``conf/`` (a checkout's, else the package's copy),
its groups, a user's ``--config-dir`` overlay, and the composed config ``train`` would see."""

from __future__ import annotations

from pathlib import Path

GROUPS = ("model", "arch", "norm", "optim", "sched", "data", "diag", "logger", "experiment")


def config_dir() -> Path:
    """``conf/`` of a source checkout, else the copy shipped inside the package."""
    here = Path(__file__).resolve().parent.parent  # the package: src/normbench or site-packages/normbench
    for candidate in (here.parent.parent / "conf", here / "conf"):
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError("normbench's conf/ directory was not found (broken install?)")


def options(group: str, extra_dirs: tuple[Path, ...] = ()) -> list[str]:
    dirs = (config_dir(), *extra_dirs)
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})


def user_config_dirs(argv: list[str]) -> tuple[Path, ...]:
    """Directories given with Hydra's ``--config-dir``/``-cd`` (a user overlay on conf/)."""
    dirs = []
    for i, a in enumerate(argv):
        if a in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]).resolve())
        elif a.startswith("--config-dir="):
            dirs.append(Path(a.split("=", 1)[1]).resolve())
    return tuple(dirs)


def compose_config(overrides: list[str] | None = None):
    """The composed, schema-checked config for ``overrides``, as `train` sees it (no run)."""
    from hydra import compose, initialize_config_dir  # deferred (start-up time): hydra
    from hydra.core.global_hydra import GlobalHydra  # deferred (start-up time): hydra

    from normbench.config.schema import register_configs  # deferred (start-up time): hydra, omegaconf

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="train"):
        cfg = compose(config_name="config", overrides=list(overrides or []))
    GlobalHydra.instance().clear()
    return cfg
