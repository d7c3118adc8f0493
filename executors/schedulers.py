"""A job's scheduler and its sampler, new or as saved: what ``--mode``, ``--sampler``, ``--baseline``,
``--prior-first`` and ``--warm-start`` make of the algorithm (``hyperband/``) for the loop. The state they are saved in
and resumed from is ``executors.state``'s; a warm start's parents are read by ``flows.parents`` (``sampler_for``,
handed in as ``warm``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from prefect_hyperband.executors.job import Job
from prefect_hyperband.hyperband import priors
from prefect_hyperband.hyperband.asha import AshaState
from prefect_hyperband.hyperband.first import Firsts
from prefect_hyperband.hyperband.priorband import PriorBandSampler
from prefect_hyperband.hyperband.sampler import RandomSampler, TPESampler
from prefect_hyperband.hyperband.scheduler import AshaScheduler, HyperbandScheduler, Sampler, Scheduler
from prefect_hyperband.hyperband.space import Space, parse
from prefect_hyperband.hyperband.warm import WarmSampler, draw_seed

#: a new job's sampler made warm from its parents' results (``flows.parents.sampler_for``)
Warm = Callable[[Job, Sampler], Sampler]


def make_sampler(job: Job, saved: dict[str, Any] | None = None, warm: Warm | None = None) -> Sampler:
    """The job's sampler, as saved or new (a new one of a ``--warm-start`` job made warm by ``warm``)."""
    if saved and saved.get("kind") == "warm":
        return WarmSampler.from_json(saved, make_sampler(job, saved["inner"]))
    if not saved and job.warm:  # its own draws: a parent of the same seed would draw the same configs again
        if warm is None:
            raise ValueError("a new --warm-start job's sampler needs its parents' results (warm=)")
        cold = dataclasses.replace(job, warm=None, seed=draw_seed(job.seed, job.warm["parents"]))
        return warm(job, make_sampler(cold))
    space = parse(job.space)
    if job.sampler == "tpe":
        return TPESampler.from_json(space, saved) if saved else TPESampler(space, job.seed, job.directions)
    if job.sampler == "priorband":
        return PriorBandSampler.from_json(space, saved) if saved else PriorBandSampler(
            space, job.seed, job.directions, job.min_resource, job.max_resource, job.eta)
    return RandomSampler.from_json(space, saved) if saved else RandomSampler(space, job.seed)


def make_scheduler(job: Job, max_trials: int, time_budget: float | None, clock: Callable[[], float],
                   saved: dict[str, Any] | None = None, warm: Warm | None = None) -> Scheduler:
    """The job's scheduler, new or as saved (its trial-rungs in flight still out: ``load_state`` replays the journal,
    then offers them again): ASHA, or Hyperband's brackets (in turn when TPE or PriorBand proposes
    configs: each bracket samples from what the earlier ones taught); with ``prior_first``, after the priors' mode
    trained straight to R; with ``baseline``, after the default config trained to R (a state saved before the
    baseline was the scheduler's goes on without one). ``warm``: as ``make_sampler``'s."""
    space = parse(job.space)
    scheduler = _schedule(job, space, max_trials, time_budget, clock, saved, warm)
    scheduler.first = Firsts.from_json(saved, requeue=False) if saved else Firsts.of(
        dict(job.default_config) if job.baseline else None, priors.mode(space) if job.prior_first else None,
        job.max_resource)
    return scheduler


def _schedule(job: Job, space: Space, max_trials: int, time_budget: float | None, clock: Callable[[], float],
              saved: dict[str, Any] | None, warm: Warm | None) -> Scheduler:
    if job.mode == "asha":
        if saved:
            return AshaScheduler(AshaState.from_json(saved["state"]), make_sampler(job, saved["sampler"]),
                                 saved["max_trials"], time_budget, clock, requeued=False)
        state = AshaState.create(job.min_resource, job.max_resource, job.eta, job.directions)
        return AshaScheduler(state, make_sampler(job, warm=warm), max_trials, time_budget, clock)
    tpe = job.sampler in ("tpe", "priorband")
    if saved:
        sampler = make_sampler(job, saved["sampler"]) if saved.get("sampler") else None
        return HyperbandScheduler.from_json(saved, space, sampler, requeue=False)
    # a warm start's brackets run as a cold job's, widest first: narrowest first (its sampler having learnt the cheap
    # rungs from the parents) took more worker-seconds to the parents' best, not fewer (docs/benchmarks.md)
    return HyperbandScheduler(job.min_resource, job.max_resource, job.eta, job.directions, space, job.seed,
                              make_sampler(job, warm=warm) if tpe or job.warm else None, sequential=tpe)
