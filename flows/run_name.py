"""A job's flow run name: the one given (the UI's form, ``--flow-run-name``, ``hb.tune(run_name=...)``) is kept;
Prefect's generated one (two words, ``brave-otter``) becomes what the run is and its job id, so no two runs share it."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from importlib import resources

from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from prefect_hyperband.executors.job import Job
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.trainers import registry


def describe(job: Job, params: TuneParams) -> None:
    """Rename the current flow run to ``what(job, params)`` unless its name was given; a failed rename is no error."""
    if not generated(flow_run.name or ""):
        return
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=what(job, params))
    except Exception:  # noqa: BLE001  (a name is a courtesy: the job goes on under Prefect's)
        pass


def what(job: Job, params: TuneParams) -> str:
    """``xgboost on bank-marketing, hyperband R=81 (20261206-101500-ab12cd)``: model or code, data, mode, R, job id."""
    model = registry.get(params.model)
    code = getattr(params, model.user_code) if model.user_code else None
    subject = os.path.basename(str(code)) if code else params.model
    if model.reads_data:
        subject += f" on {os.path.basename(params.data.rstrip('/')) or params.data}"
    return f"{subject}, {job.mode} R={job.max_resource} ({job.job_id})"


def generated(name: str) -> bool:
    """Whether ``name`` is one Prefect made up (coolname's adjective-noun slug, or the flow's name for a run that
    has none), not one a person gave."""
    words = name.split("-")
    if not name or name == "hyperband-tune":
        return True
    if len(words) != 2 or not all(re.fullmatch("[a-z]+", w) for w in words):
        return False
    vocabulary = _coolname_words()
    return not vocabulary or words[1] in vocabulary


@lru_cache(maxsize=1)
def _coolname_words() -> frozenset[str]:
    """The nouns and adjectives of coolname, which Prefect's ``generate_slug`` draws from (empty if not readable)."""
    try:
        files = [f for f in resources.files("coolname.data").iterdir() if f.name.endswith(".txt")]
        return frozenset(w for f in files for line in f.read_text().splitlines()
                         if line.strip() and not line.lstrip().startswith("#") for w in line.split())
    except Exception:  # noqa: BLE001  (a coolname without its word files: any two-word slug counts)
        return frozenset()
