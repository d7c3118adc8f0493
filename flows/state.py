"""Job state on disk: JSON files in the job directory, written atomically, read back by ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.bracket import BracketState
from prefect_hyperband.tasks.job import Job
from prefect_hyperband.trainers.base import write_json_atomic


def job_record_path(job_dir: str | Path) -> Path:
    return Path(job_dir) / "job.json"


def save_job_record(job: Job, params: dict[str, Any]) -> None:
    write_json_atomic(job_record_path(job.job_dir), {"job_id": job.job_id, "params": params, "parent_run_id": job.parent_run_id})


def load_job_record(job_dir: str | Path) -> dict[str, Any] | None:
    path = job_record_path(job_dir)
    return json.loads(path.read_text()) if path.is_file() else None


def save_bracket(job: Job, state: BracketState, rows: list[dict[str, Any]]) -> None:
    write_json_atomic(job.bracket_path(state.s), {"state": state.to_json(), "rows": rows})


def load_bracket(job: Job, s: int) -> tuple[BracketState, list[dict[str, Any]]] | None:
    path = job.bracket_path(s)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return BracketState.from_json(raw["state"]), raw["rows"]


def asha_path(job: Job) -> Path:
    return Path(job.job_dir) / "asha.json"


def save_asha(job: Job, state: AshaState, sampler: dict[str, Any], rows: list[dict[str, Any]], elapsed: float) -> None:
    write_json_atomic(asha_path(job), {"state": state.to_json(), "sampler": sampler, "rows": rows, "elapsed": elapsed})


def load_asha(job: Job) -> dict[str, Any] | None:
    path = asha_path(job)
    return json.loads(path.read_text()) if path.is_file() else None
