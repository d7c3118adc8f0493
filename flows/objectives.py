"""Several objectives as the user gives them: ``--metric name[:max|min]`` repeated, and ``--select``.

The built-in models report, besides their quality metric, three measured costs a user can pick as
objectives (``COSTS``); a user's trainer or script reports any metrics, each named with its direction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, Optional

from prefect_hyperband.hyperband.promotion import Direction

#: the costs every built-in trial-rung measures, each better smaller
COSTS: dict[str, Direction] = {
    "train_seconds": "min",  # wall seconds of the rung's training call
    "predict_ms": "min",  # milliseconds to predict 1,000 validation rows (timed on the whole validation set)
    "model_bytes": "min",  # bytes of the checkpoint
}
_DIRECTIONS: dict[str, Direction] = {"max": "max", "min": "min", "maximize": "max", "minimize": "min"}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w.\-/]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")

Select = tuple[Literal["first", "knee"]] | tuple[str, str, float]


def parse_entry(entry: str) -> tuple[str, Optional[Direction]]:
    """``name`` or ``name:max`` / ``name:min`` (``maximize``/``minimize`` too)."""
    name, sep, direction = entry.rpartition(":")
    if not sep:
        name, direction = entry, ""
    name = name.strip()
    if not name:
        raise ValueError(f"metric {entry!r} has no name; write name or name:max / name:min")
    if direction and direction.strip().lower() not in _DIRECTIONS:
        raise ValueError(f"metric {entry!r}: direction must be max or min, got {direction!r}")
    return name, _DIRECTIONS[direction.strip().lower()] if direction else None


def parse_select(text: str) -> Select:
    """``first``, ``knee``, or a constraint ``name<=bound`` (also <, >=, >)."""
    if text in ("first", "knee"):
        return (text,)  # type: ignore[return-value]
    match = _CONSTRAINT.match(text)
    if match is None:
        raise ValueError(f"select must be first, knee or a constraint like predict_ms<=2, got {text!r}")
    name, op, bound = match.groups()
    try:
        return name, op, float(bound)
    except ValueError:
        raise ValueError(f"select {text!r}: {bound!r} is not a number") from None


def check_several(entries: Sequence[str], user_code: bool) -> None:
    """Each objective after the first needs a direction (a built-in's costs have theirs); a built-in reports only
    its metric and ``COSTS``."""
    for entry in entries[1:]:
        name, given = parse_entry(entry)
        if user_code and given is None:
            raise ValueError(f"metric {entry!r}: with several objectives each needs its direction, e.g. {name}:min")
        if not user_code and name not in COSTS:
            raise ValueError(f"metric {name!r}: a built-in model reports its quality metric and "
                             f"{', '.join(COSTS)}; choose among those, or tune your own trainer")


def objectives(entries: Sequence[str], primary: str, direction: Direction, user_code: bool) -> tuple[tuple[str, Direction], ...]:
    """Every objective as (its name in MLflow, its direction), the job's metric first; () for one objective."""
    if len(entries) < 2:
        return ()
    check_several(entries, user_code)
    out: list[tuple[str, Direction]] = [(primary, direction)]
    for entry in entries[1:]:
        name, given = parse_entry(entry)
        out.append((name, given or COSTS[name]))
    return tuple(out)


def check_select(select: Select, names: Sequence[str]) -> None:
    """A constraint names one of the objectives."""
    if len(select) == 3 and select[0] not in names:
        raise ValueError(f"select constrains {select[0]!r}, which is not an objective ({', '.join(names)})")


__all__ = ["COSTS", "Select", "check_select", "check_several", "objectives", "parse_entry", "parse_select"]
