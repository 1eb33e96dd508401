"""Errors that end a run with one clear line instead of a traceback, and the one place that prints that line."""

import argparse
import os
import sys


class ConfigError(ValueError):
    """Bad user input: a config key, a value, a data file.

    The message names the key and what is allowed; the CLI prints it as one
    line (``normbench: error: ...``) and exits with status 2.
    """


class DataError(ConfigError):
    """The data a config points at is missing, empty or unreadable."""


def first_line(exc: BaseException, default: str = "") -> str:
    """The first non-empty line of an exception's message (``default`` when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else default


def error(msg: str) -> int:
    if int(os.environ.get("RANK", 0)) == 0:  # under torchrun, one line, not one per rank
        print(f"normbench: error: {msg}", file=sys.stderr)
    return 2


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are normbench's one line (``normbench: error: ...``, status 2)."""

    def error(self, message: str):
        raise ConfigError(f"{self.prog.split()[-1]}: {message} (see {self.prog} --help)")
