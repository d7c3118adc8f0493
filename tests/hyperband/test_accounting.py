from __future__ import annotations

import pytest

from prefect_hyperband.hyperband.accounting import TrialRung, summarise, table


def test_summary_counts_units_and_worker_seconds():
    rows = [
        TrialRung("a", 1, 0, 3, 3, 3.0, 0.1, 2, 0.7),
        TrialRung("b", 1, 0, 3, 3, 3.0, 0.1, 2, 0.8),
        TrialRung("b", 1, 1, 9, 6, 6.0, 0.1, 2, 0.9),
    ]
    s = summarise(rows, metric="auc", configs=2, max_resource=9, reached_max_resource=1, failed_trials=0,
                  best=("b", 9, 0.9), default_score=0.75, wall_seconds=8.0)
    assert s.resource_used == 12
    assert s.resource_without_early_stopping == 18
    assert s.worker_seconds == pytest.approx(24.3)
    # 1 worker-second per unit (24 / 12) times 18 units, plus 2 evaluations at 0.1 s
    assert s.worker_seconds_without_early_stopping == pytest.approx(36.2)
    assert s.sequential_seconds == pytest.approx(12.3)
    text = table(s)
    assert "0.7500 default config" in text and "0.9000 tuned" in text
    assert "1.5x fewer" in text and "1.5x faster" in text
