"""Smoke checks of the benchmark scripts: they import, and their Prefect-free parts run (fast, no server)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass in the module looks its module up there
    saved = dict(os.environ)
    try:
        spec.loader.exec_module(module)
    finally:  # the benchmarks quiet Prefect and MLflow through the environment: not for the tests after these
        os.environ.clear()
        os.environ.update(saved)
    return module


@pytest.mark.parametrize("name", ["bench_overhead", "bench_efficiency", "bench_quality", "bench_scaling", "bench_stalls",
                                  "bench_vs_optuna", "bench_dask_groups", "bench_dask_torch", "bench_multi_objective",
                                  "bench_priors", "bench_job_size", "bench_bookkeeping",
                                  "bench_load", "bench_startup", "bench_big_data", "bench_task_workers",
                                  "bench_torch_epoch", "bench_task_runner", "gpu_check"])
def test_imports_and_has_main(name):
    module = _load(name)
    assert callable(module.main)
    assert "Run from the repository root" in module.__doc__


def test_job_size_rates_are_per_block_of_results_in_the_order_they_ended():
    bench = _load("bench_job_size")
    rows = [{"ended": 100.0 + i * (0.01 if i < 1000 else 0.02)} for i in range(2000)]
    first, second = bench.per_thousand(rows)
    assert first == pytest.approx(100.0) and second == pytest.approx(50.0)
    assert bench.per_thousand(rows[:999]) == []  # no whole block


def test_bookkeeping_bench_does_not_start_ray_where_its_processes_would_not_fit(tmp_path):
    bench = _load("bench_bookkeeping")
    total_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    wide = int(total_gib * 1024 / bench.RAY_MIB_PER_TRIAL) + 1
    said = bench.ray(wide, 1.0, 10, tmp_path, "/nonexistent/python")
    assert isinstance(said, str) and said.startswith("not run:") and "MiB" in said
    assert bench.ray(1, 1.0, 10, tmp_path, "/nonexistent/python").startswith("not run: no /nonexistent/python")


def test_plain_loop_runs_the_whole_schedule(tmp_path):
    from prefect_hyperband.hyperband import schedule

    result = _load("bench_overhead").plain_loop(1, 9, 3, 0, tmp_path)
    assert result["trial_rungs"] == schedule.plan_summary(1, 9, 3)["trial_rungs"] == 22
    assert result["best_score"] > 0


def test_priors_bench_runs_a_whole_synthetic_job_and_times_each_target():
    bench = _load("bench_priors")
    problem = bench.synthetic(0.0)
    result = bench.run(problem, "priorband", problem.good, 0, (1.0, -1.0))  # reached at once; never
    assert result["reached"][0] is not None and result["reached"][1] is None
    assert 0 < result["reached"][0] <= result["total"] and result["best"] < 0.05
    assert result["resource"] == [1, None]  # the first result, at r=1 of the widest bracket, reached 1.0


def test_priors_bench_prior_first_reaches_an_easy_target_with_the_priors_mode_at_r():
    bench = _load("bench_priors")
    problem = bench.synthetic(0.0)
    result = bench.run(problem, "priorband", problem.good, 0, (1.0,), prior_first=True)
    assert result["resource"] == [81]  # the first result: the mode (0.55, 0.15) trained straight to R


def test_priors_bench_can_count_only_results_at_r():
    bench = _load("bench_priors")
    problem = bench.synthetic(0.0)
    result = bench.run(problem, "random", None, 0, (1.0,), best_at_r=True)
    assert result["resource"] == [81]  # every result reaches 1.0; the first that counts is the first at R


def test_priors_bench_runs_asha_one_trial_rung_at_a_time():
    bench = _load("bench_priors")
    problem = bench.synthetic(0.0)
    result = bench.run(problem, "priorband", problem.good, 0, (1.0,), mode="asha")
    assert result["reached"][0] is not None and result["best"] < 0.05


def test_priors_bench_xgboost_target_is_a_quantile_of_its_own_reference_draws():
    """The per-seed target comes from uniform configs trained straight to R on that seed's split, no sampler's."""
    bench = _load("bench_priors")
    problem = bench.xgboost("xgboost-digits", max_resource=1, reference=5)
    trainer = problem.trainer(3)
    values = [v for v, _ in bench.straight_to(1, trainer, problem.space, 5, 10_003)]
    assert problem.direction == "min" and len(set(values)) > 1
    assert problem.target(3) == pytest.approx(float(np.quantile(values, 0.1)))  # the same draws: the same target


def test_priors_bench_landscape_prints_the_references_and_the_priors_at_r(capsys):
    bench = _load("bench_priors")
    problem = bench.xgboost("xgboost-digits", max_resource=1, reference=5)
    bench.landscape(problem, [3], 5)
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    values = bench.reference_values(1, problem.trainer(3), problem.space, 5, 3)
    good = bench.straight_to(1, problem.trainer(3), problem.space, 0, 3, (problem.good,))
    assert row[0] == "3" and float(row[2]) == pytest.approx(problem.target(3), abs=1e-4)
    assert float(row[3]) == pytest.approx(min(values), abs=1e-4)  # a loss: its best is its least
    assert float(row[4]) == pytest.approx(good[0][0], abs=1e-4) and good[0][1] == problem.good


def test_priors_bench_ratio_interval_is_a_paired_bootstrap_over_seeds():
    bench = _load("bench_priors")
    # the same ratio on every seed: every resample gives it
    assert bench.ratio_interval([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx((0.5, 0.5))
    # one seed carries the mean: random's 10 s on seed 0 against 1 s elsewhere, the sampler 1 s everywhere
    low, high = bench.ratio_interval([1.0] * 5, [10.0, 1.0, 1.0, 1.0, 1.0])
    mean_ratio = 5 / 14
    assert low < mean_ratio < high and high == pytest.approx(1.0)  # resamples without seed 0 give 1x
    assert low == pytest.approx(5 / (10 * 3 + 2), abs=0.05)  # the 5th percentile: seed 0 drawn about 3 times


def test_table_formats_rows():
    common = _load("_common")
    text = common.table([("a", 1.23456, 3)], ["x", "y", "z"])
    assert "1.235" in text and text.splitlines()[1].startswith("-")
    assert common.mean_sd([1.0, 3.0], 1) == "2.0 ± 1.4"


def test_replay_makes_the_jobs_mlflow_writes(tmp_path):
    """The floor's replay with a tracking store: a child run per trial, its params once, a metric per trial-rung."""
    from mlflow import MlflowClient

    from prefect_hyperband.tracking import store as mlflow_store

    config = {"eta": 0.3, "max_depth": 3}
    rows = [{"trial_id": "t0", "bracket": 1, "rung": 0, "resource": 1, "config": config},
            {"trial_id": "t1", "bracket": 1, "rung": 0, "resource": 1, "config": {**config, "max_depth": 4}},
            {"trial_id": "t0", "bracket": 1, "rung": 1, "resource": 3, "config": config}]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow_store.check_reachable(uri)
    result = _load("bench_efficiency").replay(rows, 0, 1, 3, 3, tmp_path / "replay", nthread=1, rounds_per_unit=1,
                                              tracking_uri=uri)
    assert result["units"] == 4 and set(result["scores"]) == {("t0", 1), ("t1", 1), ("t0", 3)}
    client = MlflowClient(uri)
    runs = {r.data.tags["hyperband.trial_id"]: r for r in client.search_runs(
        [client.get_experiment_by_name("replay").experiment_id], filter_string="tags.hyperband.trial_id != ''")}
    assert set(runs) == {"t0", "t1"}
    assert all(r.info.status == "FINISHED" and r.data.params["max_depth"] for r in runs.values())
    assert all(r.data.tags["hyperband.status"] == "completed" for r in runs.values())
    assert runs["t0"].data.tags["hyperband.highest_rung"] == "1"  # its result at R brought its close's tags, as the job's
    steps = [m.step for m in client.get_metric_history(runs["t0"].info.run_id, "auc")]
    assert steps == [1, 3]
    assert client.get_metric_history(runs["t0"].info.run_id, "auc")[-1].value == result["scores"][("t0", 3)]


@pytest.mark.slow  # torch ranks, a few seconds each
def test_the_gpu_check_runs_on_this_cpu_without_prefect_or_mlflow_and_writes_its_json(tmp_path):
    """Issue 76: one call, Prefect and MLflow unimportable (as on a lent GPU machine), the GPU checks skipped here."""
    import json
    import subprocess

    out = tmp_path / "gpu_check.json"
    code = ("import runpy, sys; sys.modules['prefect'] = sys.modules['mlflow'] = None; "
            f"sys.argv = ['gpu_check.py', '--rows', '4000', '--epochs', '1', '--repeats', '1', '--threads', '1', "
            f"'--out', {str(out)!r}]; runpy.run_path({str(BENCH / 'gpu_check.py')!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = json.loads(out.read_text())["checks"]
    assert {name: c["status"] for name, c in checks.items()} == {
        "devices": "ok", "ranks": "ok", "epoch_gpu": "skipped (no GPU, or no xgboost)", "epoch_cpu": "ok", "bf16": "ok",
        "resume": "ok", "two_trials": "skipped (no GPU, or no xgboost)", "xgboost_cuda": "ok"}
    assert checks["ranks"]["figures"]["device"] == "cpu" and checks["ranks"]["figures"]["backend"] == "gloo"
    assert checks["resume"]["figures"]["within_1e-6"] and checks["resume"]["figures"]["deterministic"] == 1.0
    assert set(checks["epoch_cpu"]["figures"]) == {"32", "512"}
    assert checks["xgboost_cuda"]["figures"]["cpu"]["resumed_equals_straight"]
    assert len(proc.stdout.strip().splitlines()) == len(checks)  # one line a check


def test_task_runner_bench_runs_both_ways_and_only_prefects_keeps_results_linked(prefect_harness, tmp_path):
    """The two ways the bench compares train and evaluate the same trial-rungs without a failure; the job's way
    leaves no result linked to the flow run (``forget_results``), ``submit``'s leaves each (issue 77's figure)."""
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.flows.prepare import prepare
    from prefect_hyperband.trainers import factory

    bench = _load("bench_task_runner")
    job = prepare(TuneParams(model="synthetic", max_resource=1, job_dir=str(tmp_path / "jobs"), job_id="smoke",
                             tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", baseline=False))
    with factory.scope():
        trainer = factory.get(job.settings)
        ours = bench.measure("ours", job, trainer, 6, 2, 0)
        theirs = bench.measure("prefect", job, trainer, 6, 2, 0)
    assert ours["failed"] == theirs["failed"] == 0
    assert ours["linked"] == 0 and theirs["linked"] >= 6 * 2  # a train and an evaluate result a trial-rung at least
    assert ours["wall"] > 0 and theirs["cpu"] > 0


def test_vs_optuna_ratios_are_per_seed_with_the_cost_beyond_training_beside_prefects_floor():
    import bench_vs_optuna as bench

    results = {"optuna random+HB": [{"wall": 10.0}, {"wall": 20.0}],
               "hyperband, concurrency 1": [{"wall": 15.0}, {"wall": 22.0}],
               "hyperband, concurrency 2": [{"wall": 8.0}, {"wall": 18.0}],
               "floor: plain loop of the c=1 trial-rungs": [{"wall": 5.0, "trial_rungs": 100},
                                                            {"wall": 12.0, "trial_rungs": 200}],
               "floor: + its MLflow writes": [{"wall": 6.0}, {"wall": 14.0}],
               bench.EMPTY: [{"wall": 2.0, "cpu": 4.0}, {"wall": 3.0, "cpu": 8.0}]}
    found = bench.ratios(results)
    assert found["hyperband, concurrency 1"] == [1.5, 1.1] and found["hyperband, concurrency 2"] == [0.8, 0.9]
    assert found["ms per trial-rung beyond training, ours"] == [100.0, 50.0]
    assert found["ms per trial-rung, Prefect's 2 empty task runs"] == [20.0, 15.0]
    assert found["ms per trial-rung, Prefect's 2 empty task runs, CPU (client + server)"] == [40.0, 40.0]
    # on cores the training keeps busy, the empty tasks' CPU is wall: the floor is the MLflow row + it
    assert found["hyperband, concurrency 1, x floor on busy cores"] == [1.5, 1.0]
    assert found["hyperband, concurrency 2, x floor on busy cores"] == [0.8, round(18 / 22, 3)]
