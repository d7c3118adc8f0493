"""``prefect_hyperband.tune``: the job from Python (a script, a notebook), as a Prefect flow run."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prefect_hyperband.app.starting import FlowStart, started
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.flows.process import temporary_server
from prefect_hyperband.trainers import stopping
from prefect_hyperband.trainers.function import entry_of
from prefect_hyperband.trainers.stopping import StopToken

_DEFAULT = {name: field.default for name, field in TuneParams.model_fields.items()}  # written once, on the fields


class JobCancelled(Exception):
    """The job stopped on request (``stop.request()``, a signal); its state is saved for a resume."""


class EveryTrialFailed(Exception):
    """No trial of the job gave a result: each failed (the first's error is in the message, every traceback in the
    job's ``job.log``); the job's end is written as any job's (its parent run ``FAILED``), its flow run Failed.
    ``result``: the ``JobResult`` (no best config)."""

    def __init__(self, message: str, result: JobResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class JobResult:
    """What a job found: the best config and score (any rung, as the paper returns), where it is recorded."""

    best_config: dict[str, Any]
    best_score: float | None
    best_trial: str | None
    best_resource: int | None
    parent_run_id: str
    job_id: str
    job_dir: str
    summary: dict[str, Any]


def tune(
    train: Callable[..., Mapping[str, Any]] | str,
    space: Mapping[str, Mapping[str, Any]] | str,
    metric: str | Mapping[str, str] | None = None,
    direction: str | None = None,
    max_resource: int = _DEFAULT["max_resource"],
    eta: int = _DEFAULT["eta"],
    min_resource: int = _DEFAULT["min_resource"],
    stop: StopToken | None = None,
    metrics: Mapping[str, str] | None = None,
    run_name: str | None = None,
    **options: Any,
) -> JobResult:
    """Tune ``train(trial) -> {metric: value}`` over ``space`` with Hyperband; any ``TuneParams`` field in ``options``.

    ``stop``: a ``StopToken`` whose ``request()`` (from another thread) stops this job as Ctrl-C would: its state
    saved, ``--resume`` (``resume=True, job_id=...``) finishes it; the flow run ends Cancelled and this raises
    ``JobCancelled``. Jobs run side by side in one process (threads) each have their own.

    ``run_name``: the flow run's name in Prefect (default: what the job is and its id).

    ``train`` is a function (importable, or defined right here: then a killed job resumes only in
    this process) or its entry string, ``path/to/file.py:function`` / ``package.module:function``, or a
    training script, ``path/to/train.py`` (run under torch's launcher with ``workers`` ranks).

    Several objectives: ``metrics={"val_loss": "min", "latency_ms": "min"}`` (or as ``metric``; the first is the
    job's metric; each value ``max`` or ``min``, no ``direction``); ``train`` returns every one of them.
    """
    from prefect_hyperband.flows.prepare import new_job_id, prepare, resolve
    from prefect_hyperband.flows.tune import tune as tune_flow

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    taken = sorted(_TAKEN_BY_TUNE & set(options))
    if taken:
        raise TypeError(f"tune() takes the code as its first argument, train (a function, 'module:function', "
                        f"'file.py:function' or a script 'train.py'); drop {'=, '.join(taken)}=")
    if not (isinstance(train, str) or callable(train)):
        raise TypeError(f"train must be a function or its entry ('module:function', 'file.py:function', a script "
                        f"'train.py'), got {type(train).__name__}")
    if stop is not None and not isinstance(stop, StopToken):
        raise TypeError(f"stop must be a prefect_hyperband StopToken, got {type(stop).__name__}")
    code: dict[str, str]
    if isinstance(train, str) and train.endswith(".py"):
        code = {"script": train}
    else:
        code = {"trainer": train if isinstance(train, str) else entry_of(train)}
    named = metrics if metrics is not None else metric
    entries = [f"{name}:{way}" for name, way in named.items()] if isinstance(named, Mapping) else named
    # the schedule's defaults are not given: a resume takes the saved job's schedule unless the caller changes it
    schedule = {name: value for name, value in (("max_resource", max_resource), ("eta", eta),
                                                ("min_resource", min_resource)) if value != _DEFAULT[name]}
    params = TuneParams(**code, space=dict(space) if isinstance(space, Mapping) else space, metric=entries,
                        direction=direction, **schedule, **options)
    params = params.model_copy(update={"job_id": params.job_id or new_job_id()})  # known before its flow run begins
    prepare(resolve(params))  # bad input raises here, as the CLI's preflight: no server, no failed flow run
    temporary_server()  # without PREFECT_API_URL, as the CLI's (batched writes, flows.server's app)
    with stopping.bind(stop or StopToken()):
        flow = tune_flow.with_options(flow_run_name=_literal(run_name)) if run_name else tune_flow
        state = started(FlowStart(flow, params), params)  # a Prefect API whose database restarts: one warning line, a wait
    return _found(state, params)


def _literal(name: str) -> str:
    """``name`` as a Prefect run-name template that formats to itself (its braces doubled)."""
    return name.replace("{", "{{").replace("}", "}}")


def _found(state, params: TuneParams) -> JobResult:
    """The job's result from its flow run's final state; the exceptions of a job that did not start, was stopped or
    tuned nothing."""
    from prefect_hyperband.flows.ending import every_trial_failed

    if state is None:
        raise ConnectionError(f"the Prefect API could not start job {params.job_id} within {params.service_wait:g} s "
                              "(service_wait); nothing ran, call tune again")
    if state.is_cancelled():
        raise JobCancelled(state.message or "the job was stopped")
    failed = every_trial_failed(state)
    result = failed or state.result()
    best = result.get("best") or {}
    found = JobResult(
        best_config=dict(best.get("config") or {}), best_score=best.get("score"), best_trial=best.get("trial_id"),
        best_resource=best.get("resource"), parent_run_id=result["parent_run_id"], job_id=result["job_id"],
        job_dir=result["job_dir"], summary=result["summary"],
    )
    if failed:
        raise EveryTrialFailed(f"{state.message} (each traceback: {os.path.join(result['job_dir'], 'job.log')})", found)
    return found


#: ``tune``'s own parameters stand for these fields (``train`` is ``trainer`` or ``script``; ``metrics``, ``metric``)
_TAKEN_BY_TUNE = {"trainer", "script", "model"}


def _signature() -> inspect.Signature:
    """``tune``'s signature with every ``TuneParams`` field its ``**options`` takes, each with its default and type
    (from the fields: ``help(hb.tune)``, an IDE and ``inspect`` list them); an unknown option is refused by the
    fields' model (``extra="forbid"``)."""
    own = [p for p in inspect.signature(tune).parameters.values() if p.kind is not p.VAR_KEYWORD]
    named = {p.name for p in own} | _TAKEN_BY_TUNE
    options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=field.default,
                                 annotation=field.annotation)
               for name, field in TuneParams.model_fields.items() if name not in named]
    return inspect.Signature([*own, *options], return_annotation=JobResult)


tune.__signature__ = _signature()  # type: ignore[attr-defined]
