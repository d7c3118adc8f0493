"""Errors a person can act on: the CLI prints them as one line and exits 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input (a flag, a data file, a search space); its message names the fix."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message cut to its first line (at most ``limit`` characters): for a one-line error."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else ""
