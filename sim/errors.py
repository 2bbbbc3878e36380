"""The one exception the CLI turns into a single `error: ...` line and exit code 2."""


class SimInputError(ValueError):
    """Bad input: malformed profile or trace, unknown what-if key, value out of range."""
