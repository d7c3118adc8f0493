"""A trial, in both modes, and the message a scheduler hands its driver: train this trial to this resource."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping, Sequence

#: where a trial stands: training on, stopped at a rung (not promoted), failed, or completed (reached R)
Status = Literal["running", "stopped", "failed", "completed"]


def trial_id(bracket: int, n: int) -> str:
    """The id of bracket ``bracket``'s ``n``-th trial, in both modes: ``s2-0007``. (Ids of jobs saved before the
    format was one, ``s2-007`` in Hyperband's brackets, are kept as they were.)"""
    return f"s{bracket}-{n:04d}"


@dataclass
class Trial:
    """One config's life in its bracket, in either mode (a synchronous bracket's, ASHA's): the rung of its latest
    trial-rung, and whether that trial-rung's result is still to come (``in_flight``: handed out, waiting to be, or
    to be trained again after a resume); what its checkpoint holds; its fate. Its results are its bracket's (rung by
    rung), not the trial's."""

    trial_id: str
    bracket: int
    config: dict[str, Any]
    rung: int = 0
    resource: int = 0  # units held by ``checkpoint``
    checkpoint: str | None = None
    status: Status = "running"
    in_flight: bool = True
    error: str | None = None


def rung_scores(trial: Trial, results: Sequence[Mapping[str, Any]], rungs: Sequence[Any]) -> dict[int, Any]:
    """``trial``'s results in its bracket's ``results`` (rung k -> trial id -> score, ``rungs[k].resource`` each):
    resource -> score (None: failed), rung by rung. Both modes keep a bracket's results so."""
    t = trial.trial_id
    return {rungs[k].resource: results[k][t] for k in range(trial.rung + 1) if t in results[k]}


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
