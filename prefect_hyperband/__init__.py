"""prefect-hyperband: exact Hyperband and ASHA as Prefect flows, tracked in MLflow.

The one import package of the distribution. In the repository its subpackages live at the
root (``flows/``, ``tasks/``, ``hyperband/``, ``trainers/``, ``data/``, ``deployments/``) and
are mapped under this name by ``pyproject.toml``; importing this module imports nothing heavy.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("prefect-hyperband")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
