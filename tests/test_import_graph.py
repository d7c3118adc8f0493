"""What import-linter's contracts cannot say (they hold the layers, cycles and rooms: ``tests/test_lint.py``): no
private name taken from another module, and an import inside a function only where it defers a heavy library."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("app", "flows", "tasks", "tracking", "executors", "trainers", "hyperband", "deployments", "data", "common")

def _modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for folder in FOLDERS:
        for path in (root / folder).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found["prefect_hyperband." + ".".join(parts)] = path
    return found


def _runtime_nodes(tree: ast.AST, functions: bool = True):
    """Every node but those under ``if TYPE_CHECKING:`` (annotations only: no import at run time); without
    ``functions``, none inside a function either (what importing the module runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        if not functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of each import statement run at run time, deferred ones (inside functions) included."""
    out = []
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, [a.name for a in node.names]))
    return out


def test_no_private_name_is_imported_from_another_module():
    taken = [f"{path.relative_to(ROOT)}: {module}.{name}"
             for path in _modules().values() for module, names in _imports(path)
             if module.startswith("prefect_hyperband.") for name in names
             if name.startswith("_") and not name.startswith("__")]
    assert not taken, taken


#: the libraries an import inside a function may defer, with what importing each alone took here (a fresh
#: ``python -c "import X"``, 2 cores, 2026-12-05); a library that takes less (numpy 0.05 s, pyarrow 0.07, fsspec
#: 0.07, httpx 0.08, pydantic 0.03, rich, yaml, psutil) is imported at the module's top. ``psycopg`` (PostgreSQL)
#: is optional.
HEAVY = {"mlflow": 0.96, "torch": 0.91, "xgboost": 0.87, "sklearn": 0.74, "prefect": 0.64, "s3fs": 0.25,
         "distributed": 0.24, "pandas": 0.22, "optuna": 0.20, "sqlalchemy": 0.14, "matplotlib": 0.13,
         "pydantic_settings": 0.11, "dask": 0.10, "psycopg": None}


def _top_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it is imported: not inside a function, not under ``if TYPE_CHECKING:``."""
    return set().union(*(_targets(node) for node in _runtime_nodes(ast.parse(path.read_text()), functions=False)
                         if isinstance(node, (ast.Import, ast.ImportFrom))))


def _targets(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    return {node.module} | {f"{node.module}.{a.name}" for a in node.names}


def _heavy_libraries(root: Path) -> dict[str, set[str]]:
    """Per module of the package, the heavy libraries importing it imports (its own top-level imports, its packages'
    ``__init__``, and theirs in turn)."""
    modules = _modules(root) | {"prefect_hyperband": root / "prefect_hyperband" / "__init__.py"}
    top = {m: _top_imports(p) for m, p in modules.items() if p.is_file()}
    heavy: dict[str, set[str]] = {}

    def of(module: str) -> set[str]:
        if module not in heavy:
            heavy[module] = set()
            parts = module.split(".")
            reached = top.get(module, set()) | {".".join(parts[:i]) for i in range(1, len(parts))}
            for target in reached:
                library = target.split(".")[0]
                heavy[module] |= {library} if library in HEAVY else of(target) if target in modules else set()
        return heavy[module]

    return {m: of(m) for m in modules}


def deferred(root: Path = ROOT) -> list[tuple[str, str, set[str]]]:
    """(file:line, the import, the heavy libraries it defers) of every import inside a function of the package."""
    heavy = _heavy_libraries(root)
    found = []
    for path in sorted(_modules(root).values()):
        seen: set[int] = set()
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in seen:
                    seen.add(node.lineno)
                    libraries = set().union(*({t.split(".")[0]} & set(HEAVY) or heavy.get(t, set())
                                              for t in _targets(node)))
                    found.append((f"{path.relative_to(root)}:{node.lineno}", ast.unparse(node), libraries))
    return found


def test_an_import_inside_a_function_defers_a_heavy_library():
    """Issue 77: an import inside a function only where it defers a heavy library (the CLI's ``--help`` and a bad
    flag's one line come before Prefect, MLflow or a trainer is imported), directly or through a module of ours that
    imports one at its top; any other import sits at the module's top. The deferrals are printed by library (issue
    85: no bound on their count)."""
    found = deferred()
    light = [f"{where}: {statement}" for where, statement, libraries in found if not libraries]
    assert not light, f"imports inside functions that defer no heavy library (move them to the top): {light}"
    by_library = Counter(" + ".join(sorted(libraries)) for _, _, libraries in found)
    print(f"{len(found)} imports inside functions:", dict(by_library.most_common()))


def test_the_deferral_count_tells_a_light_import_from_a_heavy_one(tmp_path):
    """The count's own check: a light import inside a function is found light; a heavy library, directly or through a
    module of ours that imports one at its top, is found heavy; one under ``TYPE_CHECKING`` is not heavy."""
    folder = tmp_path / "common"
    folder.mkdir()
    (folder / "heavy_top.py").write_text("import pandas\n")
    (folder / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n")
    (folder / "light.py").write_text("def f():\n    import json\n    import torch.nn\n"
                                     "    from prefect_hyperband.common.heavy_top import x\n"
                                     "    from prefect_hyperband.common import typed\n")
    found = [(statement, sorted(libraries)) for _, statement, libraries in deferred(tmp_path)]
    assert found == [("import json", []), ("import torch.nn", ["torch"]),
                     ("from prefect_hyperband.common.heavy_top import x", ["pandas"]),
                     ("from prefect_hyperband.common import typed", [])]
