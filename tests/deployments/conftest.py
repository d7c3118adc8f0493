"""The end-to-end tests' fixtures see their test's outcome (``stack.running`` prints the logs of a failure)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
