"""A job's search space (given, read from a file, or the model's own; each parameter's bounds checked by the model)
and its objectives (the metric, its direction, several with ``--metric`` given again). Shared by a job's preparation (``flows.prepare``) and the facts of an earlier job worked out again
(``flows.parents``)."""

from __future__ import annotations

from typing import Any

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.flows import objectives
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband import space as spaces
from prefect_hyperband.hyperband.promotion import Direction
from prefect_hyperband.trainers import data as datasets
from prefect_hyperband.trainers.factory import model_space


def job_space(params: TuneParams, model, on_gpu: bool = False) -> tuple[Any, dict[str, Any]]:
    """The job's search space (given, a file, or the model's own: its GPU-sized one where a new job's trials have
    GPUs, ``on_gpu``) and the model's default config. A resume's space is the one its job began with: a job's
    record keeps it (``flows.prepare.resume_params``), whatever the machine resuming it has."""
    default_space, known, default_config = model_space(params.model)
    if on_gpu and model.gpu_space is not None and not params.resume:
        default_space = model.gpu_space()
    if isinstance(params.space, dict):
        space = spaces.parse(params.space, known, params.model)
    elif params.space:
        space = spaces.load(params.space, known, params.model)
    else:
        space = spaces.parse(default_space, known, params.model)
    if model.check_config is not None:
        check_bounds(space, default_config, model.check_config)
    if params.prior_first and not priors.has_priors(space):
        raise InputError("--prior-first trains the space's priors first, but no parameter of the space has one; "
                         "give it a prior: value (docs/search-spaces.md)")
    return space, default_config


def check_bounds(space: Any, default_config: dict[str, Any], check: Any) -> None:
    """Each parameter at its bounds and choices (the others at the model's defaults), by the model's own check."""
    for param in space.params:
        for value in param.choices or (param.low, param.high):
            try:
                check({**default_config, param.name: value})
            except InputError as why:
                raise InputError(f"search space: {param.name}={value!r}: {why}") from None


def job_objectives(params: TuneParams, model, spec: datasets.DataSpec) -> tuple[str, Direction, Any]:
    """The metric tuned, its direction and the objectives (several with ``--metric`` given again), checked."""
    entries = params.metric or []
    first, stated = objectives.parse_entry(entries[0]) if entries else (None, None)
    if model.metric is None:  # the user's code reads its own data; the metric is theirs, by their name
        metric = first or ""
        flag: Direction | None = None if params.direction is None else ("min" if params.direction == "minimize" else "max")
        if stated and flag and stated != flag:
            raise InputError(f"--metric {entries[0]} and --direction {params.direction} disagree; give one")
        direction: Direction = stated or flag or "max"
    else:
        metric = model.metric(spec, first[4:] if first and first.startswith("val_") else first)
        direction = datasets.metric_direction(metric)
        better = 'larger' if direction == 'max' else 'smaller'
        if stated and stated != direction:
            raise InputError(f"--metric {entries[0]}: {metric} is better {better}; drop :{stated}")
        if params.direction and params.direction != ("minimize" if direction == "min" else "maximize"):
            raise InputError(f"--direction {params.direction}: {metric} is better {better}; drop --direction")
    try:
        chosen = objectives.objectives(entries, metric if model.metric is None else f"val_{metric}", direction,
                                       model.metric is None)
        objectives.check_select(objectives.parse_select(params.select), [name for name, _ in chosen] or [metric])
    except ValueError as why:
        raise InputError(str(why)) from None
    return metric, direction, chosen
