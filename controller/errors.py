"""Errors a user can cause or mend. The CLI prints their message on one line and exits with
status 2 (``InputError``) or 1 (``WorkerLost``)."""


class InputError(ValueError):
    """Bad input: a topology, trace, plan or option that is wrong. The message names the
    offending item."""


class WorkerLost(RuntimeError):
    """A worker process of a sweep died while it ran (the system kills the largest process
    when memory runs out). Not the input's fault: the message says what to change."""
