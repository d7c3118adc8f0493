"""The scaling study's arithmetic on literal data: time to target, the cheapest and fastest good size."""

from __future__ import annotations

from prefect_hyperband.hyperband.speedup import ScaleRow, choose, default_target, table, time_to_target


def test_time_to_target_is_when_the_best_so_far_first_reaches_it():
    rows = [
        {"started": 100.0, "ended": 101.0, "score": 0.70},
        {"started": 100.5, "ended": 103.0, "score": None},  # failed
        {"started": 101.0, "ended": 102.0, "score": 0.81},
        {"started": 102.0, "ended": 104.0, "score": 0.86},
    ]
    assert time_to_target(rows, 0.80, "max") == 2.0  # the 0.81 ended at 102, 2 s after the first start
    assert time_to_target(rows, 0.86, "max") == 4.0  # reaching the target exactly counts
    assert time_to_target(rows, 0.90, "max") is None
    assert time_to_target([{"started": 0.0, "ended": 5.0, "score": 0.3}], 0.4, "min") == 5.0
    assert time_to_target(rows, None, "max") is None


def test_the_cheapest_and_fastest_are_chosen_among_the_good_sizes_only():
    rows = [
        ScaleRow(1, 0.970, 0.970, worker_seconds=100.0, wall_seconds=100.0, time_to_target=50.0),
        ScaleRow(2, 0.968, 0.900, worker_seconds=140.0, wall_seconds=70.0, time_to_target=40.0),
        ScaleRow(4, 0.940, 0.110, worker_seconds=200.0, wall_seconds=50.0, time_to_target=None),  # fast but not good
    ]
    assert choose(rows, "max", 0.005) == (1, 2)
    assert choose(rows, "max", 0.05) == (1, 4)
    assert choose([ScaleRow(1, 0.2, None, 5.0, 5.0, None), ScaleRow(2, 0.1, None, 9.0, 4.0, None)], "min", 0.0) == (2, 2)
    assert choose([ScaleRow(1, None, None, 1.0, 1.0, None)], "max", 0.1) == (None, None)
    assert default_target(0.97, "max") == 0.97 - 0.01 and default_target(0.2, "min") == 0.2 + 0.01


def test_the_table_has_a_row_per_size_and_the_answer():
    text = table([ScaleRow(1, 0.97, 0.97, 100.0, 100.0, 50.0), ScaleRow(2, 0.96, 0.5, 150.0, 60.0, None)],
                 "accuracy", 1, 1, 0.005, 0.96)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["workers", "tuned", "accuracy"] and len(lines) == 5
    assert lines[3].split()[:3] == ["2", "0.9600", "0.5000"] and lines[3].split()[-1] == "-"
    assert "cheapest 1 workers, fastest 1 workers" in lines[-1]
