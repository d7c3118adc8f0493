"""Smoke checks of the benchmark scripts: they import, and their Prefect-free parts run (fast, no server)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["bench_overhead", "bench_efficiency", "bench_quality", "bench_scaling", "bench_stalls",
                                  "bench_vs_optuna", "bench_dask_groups"])
def test_imports_and_has_main(name):
    module = _load(name)
    assert callable(module.main)
    assert "Run from the repository root" in module.__doc__


def test_plain_loop_runs_the_whole_schedule(tmp_path):
    from prefect_hyperband.hyperband import schedule

    result = _load("bench_overhead").plain_loop(1, 9, 3, 0, tmp_path)
    assert result["trial_rungs"] == schedule.plan_summary(1, 9, 3)["trial_rungs"] == 22
    assert result["best_score"] > 0


def test_table_formats_rows():
    common = _load("_common")
    text = common.table([("a", 1.23456, 3)], ["x", "y", "z"])
    assert "1.235" in text and text.splitlines()[1].startswith("-")
    assert common.mean_sd([1.0, 3.0], 1) == "2.0 ± 1.4"
