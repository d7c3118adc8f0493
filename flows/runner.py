"""One trial-rung: train → evaluate as Prefect tasks called with values, here or on the job's trial pool.

Runs in a thread of the job's executor (``executors.threads``), inside the job flow's context, so both
tasks show up under the job's flow run. A trainer's failure is the trial's (an ``Outcome`` with an
error); an error of the orchestration itself (the Prefect API, say) propagates, and the loop runs the
trial-rung again.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

from prefect import Task, tags
from prefect.utilities.annotations import quote

from prefect_hyperband.executors.job import Job
from prefect_hyperband.executors.loop import Outcome
from prefect_hyperband.hyperband.trial import TrialRung
from prefect_hyperband.tasks.prefect_internals import forget_results
from prefect_hyperband.tasks.trials import evaluate_trial, train_trial, trial_error
from prefect_hyperband.trainers import factory
from prefect_hyperband.trainers.base import Trainer, placement


def work(job: Job, trial_rung: TrialRung, trainer: Trainer) -> Outcome:
    """The ``train`` and ``evaluate`` tasks of one trial-rung with the job's ``trainer`` (handed to both, the way the
    job is); a trainer's error is the outcome's, not raised.

    On a cluster's workers (a Dask group), the group is taken first, and both task runs are tagged with its
    workers' addresses: the Prefect UI shows where each trial-rung trained. The job goes in ``quote``: Prefect
    walks every parameter of a task run for futures to resolve, and walking the job (its settings, space and
    store) took 56 of 884 GIL samples of a 256-slot job (py-spy); the task gets the job itself (the trainer too)."""
    with contextlib.ExitStack() as held:
        group = _reserve(trainer, held)
        with tags(*group):
            trained = _value(train_trial, quote(job), quote(trainer), trial_rung.trial_id, trial_rung.config,
                             trial_rung.resource, trial_rung.checkpoint)
    if isinstance(trained, BaseException):
        return Outcome(trial_rung, None, None, _describe(trained))
    with tags(*group):
        evaluated = _value(evaluate_trial, quote(job), quote(trainer), trial_rung.trial_id, trial_rung.resource, trained)
    forget_results(trained, evaluated)  # never passed on again: kept, they grew the job's memory by every trial-rung
    trained = replace(trained, model=None)  # measured: the outcome keeps the checkpoint, not the model in memory
    if isinstance(evaluated, BaseException):
        return Outcome(trial_rung, trained, None, _describe(evaluated))
    ended = time.time()
    started = ended - evaluated.seconds - trained.seconds  # the work itself, without the task runs around it
    return Outcome(trial_rung, trained, evaluated, None, started, ended)


def _value(step: Task, *args: Any) -> Any:
    """What a trial-rung's task returned, or the error raised inside it (the trial's failure: its task run Failed);
    an error of the orchestration around it (the Prefect API) propagates. A task run that ended without running
    (its state refused by the server) is the trial's error too. The value is taken from the task's engine, not
    through its state (``State.result``: a round trip through Prefect's event-loop thread)."""
    try:
        value = step(*args)
    except Exception as exc:
        if trial_error(exc):
            return exc
        raise
    return RuntimeError(f"the {step.name} task run ended without running") if value is None else value


def _reserve(trainer: Trainer, held: contextlib.ExitStack) -> tuple[str, ...]:
    """The workers the trial-rung will train on, reserved until ``held`` closes; () when it trains here, or when no
    group comes (the train task then fails with it: the trial's error)."""
    try:
        return held.enter_context(placement(trainer))
    except Exception:
        return ()


def here(job: Job, trial_rung: TrialRung) -> Outcome:
    """A remote trial-rung (a work pool's flow run, a task worker's task run) on this machine, with the trainer of
    the scope it runs in (``factory``: built on the first trial-rung, kept warm by a task worker); a trainer that does
    not build here is the trial's error, as a training's is."""
    try:
        trainer = factory.get(job.settings)
    except Exception as exc:
        return Outcome(trial_rung, None, None, _describe(exc))
    return work(job, trial_rung, trainer)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
