"""The torch job on a Dask cluster of two "hosts": each trial-rung's two DDP ranks on a group of two Dask workers,
two trial-rungs at once, and the numbers of the same job on one machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dask_cluster import cluster  # tests/dask_cluster.py

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"]  # two groups of two, each across two hosts


def rows_of(result: dict) -> list[dict]:
    return json.loads((Path(result["job_dir"]) / "state.json").read_text())["rows"]


def test_the_torch_job_on_dask_groups_equals_the_job_on_one_machine(tracking_uri, tmp_path, capsys):
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.tune import tune

    common = dict(model="torch", data="digits", min_resource=1, max_resource=9, eta=3, workers=2, seed=0,
                  baseline=False, register_model=False, job_dir=str(tmp_path / "jobs"))
    with cluster(HOSTS, str(tmp_path)) as c:
        from prefect_hyperband.flows.cli import main

        assert main(["tune", "--model", "torch", "--data", "digits", "--workers", "5", "--dask-address", c.address,
                     "--job-dir", str(tmp_path / "jobs"), "--tracking-uri", tracking_uri]) == 2  # before any training
        assert capsys.readouterr().err.strip().endswith("has 4 workers, fewer than --workers 5")
        remote = tune(TuneParams(**common, dask_address=c.address, job_id="dask"))
    local = tune(TuneParams(**common, job_id="local"))
    assert remote["summary"]["concurrency"] == 2 and local["summary"]["concurrency"] == 1
    scores = {(r["trial_id"], r["resource"]): r["score"] for r in rows_of(remote)}
    expected = {(r["trial_id"], r["resource"]): r["score"] for r in rows_of(local)}
    assert scores.keys() == expected.keys() and len(scores) == 22
    assert all(abs(scores[k] - expected[k]) <= 1e-6 for k in scores), (scores, expected)
    intervals = sorted((r["started"], r["ended"]) for r in rows_of(remote))
    assert sum(1 for (a0, a1), (b0, b1) in zip(intervals, intervals[1:]) if b0 < a1) >= 3  # both groups at once
    assert all(r["workers"] == 2 for r in rows_of(remote))
