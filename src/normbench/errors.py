"""Errors that end a run with one clear line instead of a traceback."""


class ConfigError(ValueError):
    """Bad user input: a config key, a value, a data file.

    The message names the key and what is allowed; the CLI prints it as one
    line (``normbench: error: ...``) and exits with status 2.
    """


class DataError(ConfigError):
    """The data a config points at is missing, empty or unreadable."""
