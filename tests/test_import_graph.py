"""The package's import graph (issue 77): no cycles, no private name taken from another module, MLflow imported in
one room (``tasks/``), and Prefect in its rooms (``flows/``, ``tasks/``, ``app/``; its private names in one module of
``tasks/``: ``tests/tasks/test_prefect_internals.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("app", "flows", "tasks", "executors", "trainers", "hyperband", "deployments", "data", "common")

def _modules() -> dict[str, Path]:
    found = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found["prefect_hyperband." + ".".join(parts)] = path
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node but those under ``if TYPE_CHECKING:`` (annotations only: no import at run time)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            stack.extend(node.orelse)
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


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, names in _imports(path):
            subs = {f"{target}.{n}" for n in names if f"{target}.{n}" in modules}
            hits = subs | ({target} if target in modules and len(subs) < max(1, len(names)) else set())
            edges[module] |= hits - {module}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_none_in_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_in_the_package():
    found = cycles(_graph())
    assert not found, f"import cycles: {found}"


def test_no_private_name_is_imported_from_another_module():
    taken = [f"{path.relative_to(ROOT)}: {module}.{name}"
             for path in _modules().values() for module, names in _imports(path)
             if module.startswith("prefect_hyperband.") for name in names
             if name.startswith("_") and not name.startswith("__")]
    assert not taken, taken


def _importers(library: str) -> set[str]:
    return {path.relative_to(ROOT).as_posix() for path in _modules().values()
            if any(m == library or m.startswith(f"{library}.") for m, _ in _imports(path))}


def test_mlflow_is_imported_in_its_one_room():
    outside = {p for p in _importers("mlflow") if not p.startswith("tasks/")}
    assert not outside, f"MLflow imported outside tasks/: {sorted(outside)}"


def test_prefect_is_imported_in_its_rooms_only():
    """Issue 77: Prefect's flows, subflows and the trial-rungs' task runs in ``flows/``, its tasks in ``tasks/``, the
    CLI, worker and server processes in ``app/``; the engine (``executors/``: the loop, threads, Dask), the algorithm
    and the trainers import none of it (before: five executors did)."""
    outside = {p for p in _importers("prefect") if not p.startswith(("flows/", "tasks/", "app/"))}
    assert not outside, f"Prefect imported outside its rooms: {sorted(outside)}"
