"""Jobs saved by older commits resume on this code: ce2e8a0 (before issue 62 folded the scheduler's wrappers into one
scheduler object, the journal and the goal into the loop) and 25f0326 (before issue 77 moved the Prefect-bound
executors into ``flows/`` and issue 75 gathered Prefect's internals); the saved state's format stays.

``data/saved-by-<commit>.tar.gz`` is the job folder and the MLflow store (SQLite) that the commit's package (a
worktree on ``PYTHONPATH``, its folders linked under ``prefect_hyperband/``) left after ``tune(TuneParams(
model="synthetic", max_resource=9, eta=3, seed=4, baseline=True, prior_first=True, space=SPACE, patience=2,
register_model=False, unit_seconds=0.0, concurrency=1, job_id=<saved-by-commit>, job_dir=..., tracking_uri=...))``:
stopped by its patience with trial-rungs still to train. Its absolute paths are written ``@ROOT@``, put back here."""

from __future__ import annotations

import json
import sqlite3
import tarfile
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.3, "confidence": "medium"},
         "y": {"type": "float", "low": 0.0, "high": 1.0}}


def _unpacked(root: Path, commit: str) -> Path:
    with tarfile.open(DATA / f"saved-by-{commit}.tar.gz") as tar:
        tar.extractall(root, filter="data")
    for path in (root / "jobs").rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".prev"):
            path.write_text(path.read_text().replace("@ROOT@", str(root)))
    with sqlite3.connect(root / "mlflow.db") as db:
        for table, column in [("runs", "artifact_uri"), ("experiments", "artifact_location"), ("params", "value"),
                              ("tags", "value")]:
            db.execute(f"update {table} set {column} = replace({column}, '@ROOT@', ?)", (str(root),))
    return root / "jobs"


def _rows(job_dir: Path) -> list[tuple[str, int, float]]:
    rows = json.loads((job_dir / "state.json").read_text())["rows"]
    return [(r["trial_id"], r["resource"], r["score"]) for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("snapshot", ["last", "previous"])
@pytest.mark.parametrize("commit", ["ce2e8a0", "25f0326"])
def test_a_job_saved_by_an_older_commit_resumes_to_the_rows_of_the_same_job_unbroken(tmp_path, commit, snapshot):
    """``last``: its final snapshot; ``previous``: that one damaged, its previous snapshot and the journal after it
    (the calls that commit's scheduler wrote, the baseline's and the prior's trial-rungs among them), replayed."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    job = f"saved-by-{commit}"
    jobs = _unpacked(tmp_path, commit)
    before = _rows(jobs / job)
    saved = json.loads((jobs / job / "state.json").read_text())["scheduler"]
    assert {"baseline", "prior_first"} <= set(saved) and saved["baseline"]["status"] == "completed"
    if snapshot == "previous":
        (jobs / job / "state.json").write_text("{")
    result = tune(TuneParams(job_dir=str(jobs), job_id=job, resume=True, patience=100,
                             tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    assert result.get("stopped_by") is None
    after = _rows(jobs / job)
    assert after[:len(before)] == before and len(after) > len(before)  # kept, and the rest trained
    assert len({(t, r) for t, r, _ in after}) == len(after)  # each trial-rung once: the baseline, the prior too

    whole = tune(TuneParams(model="synthetic", max_resource=9, eta=3, seed=4, baseline=True, prior_first=True,
                            space=SPACE, register_model=False, job_dir=str(tmp_path / "unbroken"), unit_seconds=0.0,
                            concurrency=1, job_id="unbroken", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    assert sorted(after) == sorted(_rows(Path(whole["job_dir"])))
