"""Errors a command-line tool reports as one clear line with exit code 2."""


class UsageError(Exception):
    """Bad input from the user: unknown preset, missing checkpoint, unsupported dtype or device,
    an architecture we do not implement, or a model that does not fit in memory."""
