"""A job saved by ce2e8a0 resumes on this code (issue 62: the scheduler's wrappers folded into one scheduler object,
the journal and the goal into the loop; the saved state's format stays).

``data/saved-by-ce2e8a0.tar.gz`` is the job folder and the MLflow store (SQLite) that ce2e8a0's package (a worktree
on ``PYTHONPATH``) left after ``tune(TuneParams(model="synthetic", max_resource=9, eta=3, seed=4, baseline=True,
prior_first=True, space=SPACE, patience=2, register_model=False, unit_seconds=0.0, concurrency=1, job_id=JOB,
job_dir=..., tracking_uri=...))``: stopped by its patience, one trial-rung of bracket 0 still to train. Its absolute
paths are written ``@ROOT@``, put back here."""

from __future__ import annotations

import json
import sqlite3
import tarfile
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "saved-by-ce2e8a0.tar.gz"
JOB = "saved-by-ce2e8a0"
SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0, "prior": 0.3, "confidence": "medium"},
         "y": {"type": "float", "low": 0.0, "high": 1.0}}


def _unpacked(root: Path) -> Path:
    with tarfile.open(DATA) as tar:
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
def test_a_job_saved_by_ce2e8a0_resumes_to_the_rows_of_the_same_job_unbroken(tmp_path, snapshot):
    """``last``: its final snapshot; ``previous``: that one damaged, its first snapshot (no rows) and the journal
    after it, whose calls ce2e8a0's wrappers wrote (the baseline's and the prior's trial-rungs among them), replayed."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    jobs = _unpacked(tmp_path)
    before = _rows(jobs / JOB)
    saved = json.loads((jobs / JOB / "state.json").read_text())["scheduler"]
    assert {"baseline", "prior_first"} <= set(saved) and saved["baseline"]["status"] == "completed"
    if snapshot == "previous":
        (jobs / JOB / "state.json").write_text("{")
    result = tune(TuneParams(job_dir=str(jobs), job_id=JOB, resume=True, patience=100,
                             tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    assert result.get("stopped_by") is None
    after = _rows(jobs / JOB)
    assert after[:len(before)] == before and len(after) > len(before)  # kept, and the rest trained
    assert len({(t, r) for t, r, _ in after}) == len(after)  # each trial-rung once: the baseline, the prior too

    whole = tune(TuneParams(model="synthetic", max_resource=9, eta=3, seed=4, baseline=True, prior_first=True,
                            space=SPACE, register_model=False, job_dir=str(tmp_path / "unbroken"), unit_seconds=0.0,
                            concurrency=1, job_id="unbroken", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"))
    assert sorted(after) == sorted(_rows(Path(whole["job_dir"])))
