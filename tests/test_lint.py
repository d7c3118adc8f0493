"""The ecosystem's tools hold the house's rules: import-linter's contracts (pyproject.toml: the layers, no cycles, a
pure ``hyperband/``, an engine and trainers that load neither Prefect nor MLflow, MLflow and Prefect in their rooms,
indirect imports included) and ruff's checks, on the package as it installs."""

from __future__ import annotations

import json
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


_ROOMS = r"""
import ast, json, pathlib, grimp
graph = grimp.build_graph("prefect_hyperband", include_external_packages=True)
wrong = []
for module in sorted(graph.find_descendants("prefect_hyperband.flows")):
    if not graph.chain_exists(importer=module, imported="prefect") and any(
            not m.startswith("prefect_hyperband.flows") for m in graph.find_modules_that_directly_import(module)):
        wrong.append(f"{module}: in flows/, loads no Prefect and is imported from outside flows/")
root = pathlib.Path("prefect_hyperband/tasks")
for path in sorted(root.glob("*.py")):
    tree = ast.parse(path.read_text())
    tasks = [f for f in tree.body if isinstance(f, ast.FunctionDef) and any(
        ast.unparse(d.func if isinstance(d, ast.Call) else d) == "task" for d in f.decorator_list)]
    if path.stem not in ("__init__", "prefect_internals") and not tasks:
        wrong.append(f"tasks/{path.name}: defines no Prefect task")
print(json.dumps(wrong))
"""


def test_each_room_holds_what_its_name_says(tmp_path):
    """What no contract says: every module in tasks/ defines a Prefect task (but the one internals module), and every
    module in flows/ loads Prefect or serves only flows/ (``docs/how-it-works.md``, "Layout")."""
    tree = _installed_tree(tmp_path / "rooms")
    done = subprocess.run([sys.executable, "-c", _ROOMS], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == []
