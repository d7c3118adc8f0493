"""The tune flow's parameters as Prefect users give them: flat, one per ``TuneParams`` field, in the order a user
reaches for them. ``prefect deployment run ... --param max_resource=9`` merges over the deployment's other values, and
the UI's form shows one field per parameter, each with its description and its choices."""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

from pydantic import Field

from prefect_hyperband.flows.params import TuneParams, flat

#: the fields a user reaches for first, in the form's order; the others follow in the model's order
FIRST = ("model", "data", "target", "metric", "direction", "max_resource", "eta", "min_resource", "mode", "sampler",
         "max_trials", "time_budget", "seed", "workers", "gpus", "device", "concurrency", "space", "trainer", "script",
         "experiment", "tracking_uri", "register_model", "force_champion", "baseline", "job_id", "resume")

#: the one nested parameter of a deployment made by an earlier ``hyperband deploy``: still run, with a warning
LEGACY = "params"
LEGACY_WARNING = ("this deployment passes the job's parameters as one nested 'params' object (made by an earlier "
                  "hyperband deploy); run `hyperband deploy` again for one parameter per field "
                  "(--param max_resource=9)")


def order() -> tuple[str, ...]:
    """Every ``TuneParams`` field once: ``FIRST``, then the rest in the model's order."""
    fields = TuneParams.model_fields
    return (*(n for n in FIRST if n in fields), *(n for n in fields if n not in FIRST))


def signature() -> inspect.Signature:
    """The flow's signature: ``params`` (a whole ``TuneParams`` from Python, or a legacy deployment's object; last in
    the form), then a keyword per field (its type, constraints, default and description: Prefect's schema is the
    model's)."""
    fields = order()
    parameters = [inspect.Parameter(
        LEGACY, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Optional[dict[str, Any]],
        default=Field(None, description="A deployment made by an earlier hyperband deploy: the job's parameters in "
                                        "one object, which the fields above override (run hyperband deploy again).",
                      json_schema_extra={"position": len(fields) + 1}))]  # after every field
    for name in fields:
        field = TuneParams.model_fields[name]
        annotation = _choices(field.annotation)
        annotation = Annotated[(annotation, *field.metadata)] if field.metadata else annotation
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                            default=Field(field.default, description=field.description)))
    return inspect.Signature(parameters, return_annotation=dict[str, Any])


def _choices(annotation: Any) -> Any:
    """``Optional[Literal[a, b]]`` as ``Literal[a, b, None]``: one enum, which Prefect's form shows as a drop-down
    (a union of an enum and null is a type switch and a free text field there); other types as they are."""
    if get_origin(annotation) is Union:
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1 and get_origin(members[0]) is Literal:
            return Literal[(*get_args(members[0]), None)]
    return annotation


def from_flow(values: dict[str, Any]) -> tuple[TuneParams, bool]:
    """The job's parameters from the flow's: those that differ from their defaults (Prefect fills in every default),
    over ``params`` (a ``TuneParams``, or a legacy deployment's object); and whether it was a legacy object. Raises
    ``ValidationError``."""
    values = dict(values)
    whole = values.pop(LEGACY, None)
    given = {name: value for name, value in values.items() if value != TuneParams.model_fields[name].default}
    if isinstance(whole, TuneParams):
        return (TuneParams(**{**flat(whole), **given}) if given else whole), False
    return TuneParams(**{**(whole or {}), **given}), whole is not None
