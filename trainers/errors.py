"""Errors a person can act on: the CLI prints them as one line and exits 2."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input (a flag, a data file, a search space); its message names the fix."""
