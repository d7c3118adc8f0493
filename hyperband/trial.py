"""A trial, in both modes, and the message a scheduler hands its driver: train this trial to this resource."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from prefect_hyperband.hyperband.promotion import Score

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


@dataclass(frozen=True)
class TrialRecord:
    """A trial as the job reports it, whatever scheduler ran it."""

    trial_id: str
    bracket: int
    config: dict[str, Any]
    status: Status
    rung: int  # the rung of its latest trial-rung (its result there may be still to come)
    resource: int  # units its checkpoint holds
    scores: dict[int, Score]  # resource -> metric or objectives' values (None: failed there)
    error: str | None = None


Kind = Literal["failed", "completed", "stopped", "promoted", "rung_closed"]
#: the kinds that settle a trial's fate (its tracking run can be closed)
ENDED: frozenset[str] = frozenset({"failed", "completed", "stopped"})


@dataclass(frozen=True)
class Decision:
    """One thing a result decided. A trial ``failed``, ``completed`` (reached R), was ``promoted`` to the next
    rung or ``stopped`` there; or rung ``rung`` of bracket ``bracket`` closed (``rung_closed``, no trial id:
    synchronous brackets, after the decisions of its trials)."""

    kind: Kind
    bracket: int
    rung: int  # index of the rung the decision was taken at
    resource: int  # that rung's resource
    trial_id: str | None = None
    n_rungs: int = 0  # rungs of the bracket


def ended(decisions: list[Decision]) -> list[str]:
    """The trials whose fate ``decisions`` settled."""
    return [d.trial_id for d in decisions if d.kind in ENDED and d.trial_id is not None]
