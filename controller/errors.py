"""Errors a user can cause. The CLI prints their message on one line and exits with status 2."""


class InputError(ValueError):
    """Bad input: a topology, trace, plan or option that is wrong. The message names the
    offending item."""
