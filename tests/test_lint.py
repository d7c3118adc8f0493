"""The ecosystem's tools hold the house's rules: import-linter's contracts (pyproject.toml: the layers, no cycles, a
pure ``hyperband/``, an engine and trainers that load neither Prefect nor MLflow, MLflow and Prefect in their rooms,
indirect imports included) and ruff's checks, on the package as it installs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _installed_tree(where: Path) -> Path:
    """The package laid out as the wheel installs it (``prefect_hyperband/<folder>``, links to the repository's
    folders, as pyproject's package-dir maps them): import-linter reads the graph from the files it finds there."""
    import tomllib

    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = where / "prefect_hyperband"
    package.mkdir(parents=True)
    (package / "__init__.py").symlink_to(ROOT / "prefect_hyperband" / "__init__.py")
    for name, folder in mapping.items():
        parts = name.split(".")
        if len(parts) == 2:  # a top-level folder; its subpackages come with it
            (package / parts[1]).symlink_to(ROOT / folder, target_is_directory=True)
    return where


def test_the_import_contracts_hold(tmp_path):
    tree = _installed_tree(tmp_path / "lint")
    done = subprocess.run([_tool("lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "broken" in done.stdout and " 0 broken" in done.stdout  # every contract ran, none broke


def test_ruff_finds_nothing(tmp_path):
    done = subprocess.run([_tool("ruff"), "check", "--no-cache", "--output-format", "concise", str(ROOT)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
