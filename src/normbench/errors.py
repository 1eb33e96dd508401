"""Errors that end a run with one clear line instead of a traceback."""


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
