"""The ``export`` and ``sample`` subcommands (the cli package dispatches here)."""

from __future__ import annotations

import os

from normbench.errors import ConfigError, Parser, error


def export_main(argv: list[str]) -> int:
    from normbench.export import export_run  # deferred (start-up time): torch

    p = Parser(
        prog="python -m normbench export",
        description="Write a run's model as a directory Hugging Face transformers loads offline.",
    )
    p.add_argument("run_dir", help="a run directory (with checkpoints/last.pt)")
    p.add_argument("out_dir", help="a new (or empty) directory to write")
    p.add_argument("--custom", action="store_true", help="the custom class even where a stock one fits")
    _quiet_transformers()
    try:
        args = p.parse_args(argv)
        export_run(args.run_dir, args.out_dir, custom=args.custom)
    except ConfigError as exc:
        return error(str(exc))
    except OSError as exc:  # reading the run (every write to OUT_DIR is one ConfigError line already)
        return error(f"export: cannot read {exc.filename or args.run_dir} ({exc.strerror or exc})")
    return 0


def sample_main(argv: list[str]) -> int:
    from normbench.export.sample import main  # deferred (start-up time): torch, hydra, omegaconf

    _quiet_transformers()
    return main(argv)


def _quiet_transformers() -> None:
    """No progress bars or load reports on the console (errors still surface)."""

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils import logging as hf_logging  # deferred (start-up time): transformers

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
