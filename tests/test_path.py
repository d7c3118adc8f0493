"""The path of one trial-rung, as the code runs it: every function of the package that a job of one trial-rung passes
from the scheduler's decision to the result in the saved state, recorded with ``sys.setprofile`` on every thread and
checked to pass through its layers (no bound on its counts); ``python tests/test_path.py --docs`` writes the list as
it ran into ``docs/how-it-works.md`` (its ``path`` block and counts).

A function is a ``def`` or a ``lambda`` (a comprehension is an expression: Python 3.12 inlines it, PEP 709). Each is
listed once, under the thread it first ran on (the loop's, the trial-rung's, MLflow's writer's, the group subflow's
start), in the order of its first call; the order, and for a function two threads call the thread that came first,
may differ from run to run (whether the trial-rung ended before the loop's next look), and so the changes of folder
counted on one run; the docs keep one observed order.

The job runs in a process of its own (this file run as a script, pointed at the test session's Prefect server): in
the test's process, earlier tests' caches and threads (a writer, a trial thread of a job gone) changed the path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import prefect_hyperband.executors

ROOT = Path(__file__).resolve().parents[1]
#: where the package's folders are (the repository, installed editable; ``site-packages/prefect_hyperband`` from a wheel)
PACKAGE = str(Path(prefect_hyperband.executors.__file__).resolve().parent.parent) + "/"
FOLDERS = ("app/", "flows/", "executors/", "tasks/", "tracking/", "trainers/", "hyperband/", "deployments/", "data/", "common/")
DOCS = ROOT / "docs" / "how-it-works.md"
BLOCK = re.compile(r"```text path\n(.*?)```", re.S)
SUMMARY = re.compile(r"\*\*(\d+) functions, (\d+) changes of folder\*\*")

pytestmark = pytest.mark.usefixtures("prefect_harness")


def recorded(job_dir: Path) -> list[tuple[str, str, str]]:
    """(thread, file, function) of every call of the package's code during a one-trial-rung synthetic job."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    calls: list[tuple[str, str, str]] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            where = frame.f_code.co_filename[len(PACKAGE):]
            if where.startswith(FOLDERS):
                calls.append((threading.current_thread().name, where, frame.f_code.co_qualname))

    params = TuneParams(model="synthetic", max_resource=1, seed=0, job_dir=str(job_dir), baseline=False,
                        concurrency=1, register_model=False)
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        result = tune(params)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert result["summary"]["trial_rungs"] == 1
    return calls


def path(calls: list[tuple[str, str, str]]) -> dict[str, list[str]]:
    """The functions from the scheduler's decision to the saved result, once each, per thread (its name without
    numbers: ``hyperband-trial-3`` is ``hyperband-trial``), in the order of their first call."""
    calls = [c for c in calls if not c[2].endswith(("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>"))]
    start = next(i for i, c in enumerate(calls) if c[2] == "Schedule.next_trial_rung")
    end = next(i for i, c in enumerate(calls) if i > start and c[2] == "Storage.append")
    threads: dict[str, list[str]] = {}
    seen: set[str] = set()
    for thread, where, name in calls[start:end + 1]:
        functions = threads.setdefault(re.sub(r"[-_ ]?\d+", "", thread), [])
        if f"{where} {name}" not in seen:
            seen.add(f"{where} {name}")
            functions.append(f"{where} {name}")
    return {thread: functions for thread, functions in threads.items() if functions}


def documented() -> tuple[dict[str, list[str]], tuple[int, int]]:
    """The docs' path block (``[thread]`` then its functions, a line each) and the figures its text gives."""
    text = DOCS.read_text()
    threads: dict[str, list[str]] = {}
    current: list[str] = []
    for line in BLOCK.search(text).group(1).splitlines():
        line = line.strip()
        if line.startswith("["):
            current = threads.setdefault(line.strip("[]"), [])
        elif line:
            current.append(re.sub(r"^\d+\.\s*", "", line))
    functions, changes = SUMMARY.search(text).groups()
    return threads, (int(functions), int(changes))


def changes_of_folder(threads: dict[str, list[str]]) -> int:
    """How often the next function listed is in another folder than the one before it (threads in the docs' order)."""
    folders = [f.split("/")[0] for functions in threads.values() for f in functions]
    return sum(a != b for a, b in zip(folders, folders[1:]))


def block(threads: dict[str, list[str]]) -> str:
    lines, n = [], 0
    for thread, functions in threads.items():
        lines.append(f"[{thread}]")
        for f in functions:
            n += 1
            lines.append(f"{n:3d}. {f}")
    return "\n".join(lines) + "\n"


def ran_path(tmp_path: Path) -> dict[str, list[str]]:
    """The path of a one-trial-rung job run in a process of its own, pointed at this process's Prefect server."""
    from prefect.settings import PREFECT_API_URL

    out = tmp_path / "calls.json"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "HYPERBAND_MLFLOW_WRITER": "thread"}
    done = subprocess.run([sys.executable, __file__, str(out), str(tmp_path / "jobs")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return path([tuple(c) for c in json.loads(out.read_text())])


def test_the_path_of_one_trial_rung_is_recorded_through_its_layers(tmp_path, tracking_uri):
    """One trial-rung's path as it ran, per thread (printed for the docs: ``write_docs`` puts it in
    docs/how-it-works.md): the job's thread decides and loops over it in the engine, its trial thread runs it as
    Prefect task runs into a trainer, and its result is written to MLflow from its room (tracking/). No bound on its
    counts (a helper more or a module moved is no failure); the docs say the counts of the day."""
    ran = ran_path(tmp_path)
    print(block(ran))
    print(f"{sum(len(f) for f in ran.values())} functions, {changes_of_folder(ran)} changes of folder")
    listed = [f for fs in ran.values() for f in fs]
    assert any(f.startswith("executors/loop.py") for f in ran["MainThread"])
    assert any(f.startswith("trainers/") for f in ran["hyperband-trial"])
    assert any(f.startswith("flows/") for f in ran["hyperband-trial"])
    assert any(f.startswith("tracking/records.py") for f in listed)


def write_docs(threads: dict[str, list[str]]) -> None:
    """docs/how-it-works.md's path block and its counts, as ``threads`` ran."""
    text = BLOCK.sub(lambda m: f"```text path\n{block(threads)}```", DOCS.read_text(), count=1)
    functions, changes = sum(len(f) for f in threads.values()), changes_of_folder(threads)
    DOCS.write_text(SUMMARY.sub(f"**{functions} functions, {changes} changes of folder**", text, count=1))


def test_the_docs_path_block_parses_into_threads_of_functions():
    docs, (functions, changes) = documented()
    assert "MainThread" in docs and "hyperband-trial" in docs
    assert all(re.fullmatch(r"[a-z_]+/[a-z_/]+\.py [\w.<>]+", f) for fs in docs.values() for f in fs)
    assert functions > 0 and 0 < changes < functions
    listed = [f for fs in docs.values() for f in fs]
    assert functions == len(listed) == len(set(listed)), "the docs' count is not their list's, once each"
    assert changes == changes_of_folder(docs), "the docs' changes of folder are not their list's (write_docs)"


if __name__ == "__main__":
    if sys.argv[1:] == ["--docs"]:  # the docs from a run: python tests/test_path.py --docs (a temporary server)
        import tempfile

        from prefect_hyperband.flows.process import temporary_server

        temporary_server()  # the CLI's (its start bound is a busy machine's), not Prefect's ephemeral one
        with tempfile.TemporaryDirectory() as tmp:
            calls = recorded(Path(tmp) / "jobs")
        write_docs(path([tuple(c) for c in calls]))
    else:  # the recorded job, in a process of its own: python tests/test_path.py OUT JOB_DIR
        Path(sys.argv[1]).write_text(json.dumps(recorded(Path(sys.argv[2]))))
