"""What every HeroServe command line shares (controller and agents alike).

:class:`DefaultsHelpFormatter`: ``--help`` shows each option's default; like
``argparse.ArgumentDefaultsHelpFormatter``, but also for options given no help text, and
not for defaults that mean "not given" (None, False, an empty list) or that the help text
already states. :func:`missing_dependency`: one line when an extra is not installed.
:class:`UsageError`: a bad command line or configuration, one line and exit status 2."""

from __future__ import annotations

import argparse
import copy
import sys


class UsageError(Exception):
    """Bad command line or configuration: the message is the one line the user sees, and the
    command exits with status 2."""


def _shows_default(action: argparse.Action) -> bool:
    d = action.default
    # identity, not equality: a default of 0 or 0.0 is a value to show (0 == False)
    unset = d is None or d is False or d is argparse.SUPPRESS or (isinstance(d, list) and not d)
    return bool(action.option_strings) and not unset


class DefaultsHelpFormatter(argparse.HelpFormatter):
    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and _shows_default(action):
            action = copy.copy(action)  # argparse prints no help line for an empty help
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not _shows_default(action) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def missing_dependency(exc: ModuleNotFoundError, prog: str, install: str) -> int:
    """One line for a third-party module this installation lacks (an extra not installed),
    exit status 2; our own modules missing is a broken installation: re-raised."""
    if (exc.name or "").split(".")[0] in ("controller", "agents"):
        raise exc
    print(
        f"{prog}: error: {exc.name} is not installed: {install} (docs/install.md)", file=sys.stderr
    )
    return 2
