"""The message a scheduler hands its driver: train this trial to this resource."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

#: where a trial stands: training on, stopped at a rung (not promoted), failed, or completed (reached R)
Status = Literal["running", "stopped", "failed", "completed"]


def trial_id(bracket: int, n: int) -> str:
    """The id of bracket ``bracket``'s ``n``-th trial, in both modes: ``s2-0007``. (Ids of jobs saved before the
    format was one, ``s2-007`` in Hyperband's brackets, are kept as they were.)"""
    return f"s{bracket}-{n:04d}"


@dataclass(frozen=True)
class TrialRung:
    """Train ``trial_id`` to ``resource`` units (rung ``rung`` of bracket ``bracket``), resuming ``checkpoint``."""

    trial_id: str
    bracket: int
    rung: int
    resource: int
    config: dict[str, Any]
    checkpoint: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
