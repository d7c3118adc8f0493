"""The folders' layering (``docs/how-it-works.md``, "Layout"): which folder of the package may import which.

    app/        what a user types or calls: the CLI and its terminal, the Python API (``hb.tune``), ``hyperband deploy``
      ↓
    flows/      the Prefect flows, and what runs trial-rungs on Prefect (task workers, work pools, the server, the log)
      ↓
    tasks/      the Prefect tasks: train, evaluate, promote, the reports, the champion's registration
      ↓
    tracking/   the MLflow room: every module that imports MLflow (the writer, runs, datasets, flavours, the store)
      ↓
    executors/  the engine: the loop, threads, Dask groups, torch's warm pools, the state, storage, the job, progress
      ↓
    trainers/   what a trial-rung trains: XGBoost, torch, synthetic, the user's function or script
    hyperband/  the algorithm: no Prefect, MLflow or trainer (beside trainers/, neither imports the other)
      ↓
    common/     what every folder may import: errors a person acts on, files written whole, locks, a free port

The arrows are import-linter's ``layers`` contract (pyproject.toml; ``tests/test_lint.py`` runs it, deferred and
indirect imports included). A model's plug-in (``trainers/plugins/``) wires its trainer to the executor that places
it (Dask groups, torch's warm pools), so it may import ``executors``; the trainer itself is given that placement and
imports none. This file holds what no linter says: module-level state listed with its reason, the README's
commands, modules' and functions' sizes.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the package's folders of code (import-linter's contracts in pyproject.toml hold which may import which)
FOLDERS = ("common", "hyperband", "trainers", "tracking", "tasks", "executors", "flows", "app")


#: calls whose result, kept at a module's top, is state of the process (shared by every job it runs)
_STATEFUL_CALLS = {"Lock", "RLock", "local", "WeakSet", "WeakValueDictionary", "Event", "ContextVar", "set", "dict",
                   "list", "defaultdict", "OrderedDict"}


def _module_state() -> set[tuple[str, str]]:
    """(file, name) of every module-level object of the package that holds state across calls: an empty container
    filled at run time, a lock, a thread-local, a weak set, a context variable, a function behind ``lru_cache``."""
    found = set()
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                name, value = None, None
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    name, value = node.targets[0].id, node.value
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                    name, value = node.target.id, node.value
                elif isinstance(node, ast.FunctionDef) and any(
                        ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1] in {"lru_cache", "cache"}
                        for d in node.decorator_list):
                    found.add((path.relative_to(ROOT).as_posix(), node.name))
                    continue
                empty = isinstance(value, (ast.Dict, ast.Set, ast.List)) and not getattr(value, "keys", None) and \
                    not getattr(value, "elts", None)
                call = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in _STATEFUL_CALLS and \
                    not (ast.unparse(value.func) in {"set", "dict", "list"} and (value.args or value.keywords))
                if name and (empty or call):
                    found.add((path.relative_to(ROOT).as_posix(), name))
            found |= {(path.relative_to(ROOT).as_posix(), name) for name in _filled_literals(path)}
    return found


_MUTATORS = {"append", "add", "update", "pop", "clear", "setdefault", "extend", "remove", "discard", "insert"}


def _filled_literals(path: Path) -> set[str]:
    """Module-level dict, list or set literals that are not empty but written to at run time (``NAME[k] = v``,
    ``NAME.update(...)``): state too, though they start with a value (``_JOINED = {"key": None}``)."""
    tree = ast.parse(path.read_text())
    literals = {n.targets[0].id if isinstance(n, ast.Assign) else n.target.id
                for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                and isinstance(n.targets[0] if isinstance(n, ast.Assign) else n.target, ast.Name)
                and isinstance(n.value, (ast.Dict, ast.List, ast.Set))}
    written = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for target in (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]):
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    written.add(target.value.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS \
                and isinstance(node.func.value, ast.Name):
            written.add(node.func.value.id)
    return literals & written


def test_the_contributors_page_lists_every_piece_of_module_level_state_with_its_reason():
    import re

    text = (ROOT / "docs" / "contributing.md").read_text()
    section = text[text.index("## Module-level state"):]
    section = section.split("\n## ")[0]
    listed = set()
    for file, names, reason in re.findall(r"^\| `([^`]+\.py)` \| ([^|]+) \| ([^|]+) \|$", section, re.M):
        assert len(reason.strip()) > 20, f"{file}: no reason given"
        listed |= {(file, n) for n in re.findall(r"`([A-Za-z_]\w*)`", names)}
    found = _module_state()
    assert not found - listed, f"module-level state docs/contributing.md does not list: {sorted(found - listed)}"
    assert not listed - found, f"docs/contributing.md lists state the code no longer has: {sorted(listed - found)}"


def test_the_readmes_two_commands_are_what_ci_runs():
    """Two commands, one that installs and runs the default job, one that installs and runs the tests; CI runs the
    test command as the README writes it (the same line in ``.ci/run``), and the default job runs end to end from the
    wheel (``tests/test_package.py``)."""
    import re

    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Two commands.*?```bash\n(.*?)```", text, re.S).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2 and commands[0].endswith("hyperband tune") and "pytest" in commands[1], commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci, ".ci/run must run the README's test command, as the README writes it"


#: issue 38's bounds: a module a newcomer reads in one sitting, a function on one screen
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def test_no_module_over_400_lines_no_function_over_60():
    too_long = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            text = path.read_text()
            if len(text.splitlines()) > MAX_MODULE_LINES:
                too_long.append(f"{where}: {len(text.splitlines())} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    assert not too_long, f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function: {too_long}"
