"""``--warm-start JOB ...``: the earlier jobs a new job starts from, found in this job's store, compared with it,
and read (``hyperband.warm`` holds what each kind of warm start does with them).

A job's record (``job.json``) keeps the facts a later job compares (``facts``): the model (and the user's code),
the metric and its direction, the space, what one unit of resource means, and the digest of the data's content
whatever its split (``tracking.datasets.content_digest``). A parent with all of them equal is ``identical``; any
other is ``transfer``, and the note says what differs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.executors.job import Job
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.hyperband import schedule, warm
from prefect_hyperband.hyperband.promotion import as_direction, best_key, failed
from prefect_hyperband.hyperband.promotion import first as first_value
from prefect_hyperband.hyperband.space import parse
from prefect_hyperband.trainers import registry
from prefect_hyperband.trainers.tables import lineage_of


def facts(job: Job, params: Any) -> dict[str, Any]:
    """What a later job compares with this one (kept in ``job.json``)."""
    model = registry.get(job.settings.model)
    digest = lineage = None
    if model.reads_data and not model.user_code:
        from prefect_hyperband.tracking.datasets import content_digest

        try:
            digest = content_digest(job.settings.data)
            lineage = lineage_of(job.settings.data.data)  # a resume compares it (``flows.prepare``)
            if lineage is not None:  # and the features a checkpoint was trained on
                from prefect_hyperband.trainers.data import layout_of

                lineage["features"] = list(layout_of(job.settings.data).feature_names)
        except Exception as exc:  # noqa: BLE001  (a trial pool's data, not readable here: never "the same data")
            digest = f"unread ({type(exc).__name__})"
    return {"model": job.settings.model, "code": params.trainer or params.script, "metric": job.metric_key,
            "direction": job.direction, "objectives": [list(o) for o in job.objectives], "space": _bare(job.space),
            "data": digest, "data_name": params.data if model.reads_data and not model.user_code else None,
            "data_lineage": lineage,
            "unit": {"rounds_per_unit": params.rounds_per_unit, "unit_seconds": params.unit_seconds}}


def _bare(space: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The space without the priors a warm start or the user put on it: what its values can be."""
    return {name: {k: v for k, v in spec.items() if k not in ("prior", "confidence")} for name, spec in space.items()}


def plan(job: Job, params: Any, record: dict[str, Any] | None) -> Job:
    """``job`` warm-started from ``params.warm_start``: its ``warm`` plan set (and its space's priors, with
    PriorBand on other data). A resume takes the plan its job began with (``record``). Bad input: ``InputError``."""
    if record is not None and record.get("warm"):
        saved = record["warm"]
        return dataclasses.replace(job, space=saved["space"], warm=saved)
    ids = list(dict.fromkeys(params.warm_start or []))  # each parent once
    if not ids:
        return job
    mine = facts(job, params)
    found = [_parent(job, pid) for pid in ids]
    parents = [(pid, pf, [(c, r, v) for c, r, v, _ in rs]) for pid, pf, rs in found]
    space = parse(job.space)
    for pid, pf, results in parents:
        best = warm.best_configs(results, _directions(pf), 1)
        if not best:
            raise InputError(f"--warm-start {pid}: the job has no finished result to start from")
        if not warm.in_common(space, best[0]):
            raise InputError(f"--warm-start {pid}: its space ({', '.join(pf['space'])}) has nothing in common with "
                             f"this job's ({', '.join(space.names)})")
    differ = [(pid, why) for pid, pf, _ in parents for why in [_difference(mine, pf)] if why]
    kind = "transfer" if differ else "identical"
    widest = schedule.brackets(job.min_resource, job.max_resource, job.eta)[0].rungs[0].n_configs
    k = min(job.eta, max(1, widest // job.eta))  # η of the first bracket's configs, at most a 1/η share of it
    theirs = None
    if kind == "identical":
        results = [r for _, _, rs in parents for r in rs]
        theirs = _parents_best(job, found)
        said = f"their best {job.metric_key} {theirs['score']:.4f} at r={theirs['resource']}"  # type: ignore[index]
        told = {"tpe": "TPE", "priorband": "PriorBand"}.get(job.sampler)
        first = [] if told else warm.best_configs(results, job.directions, k)
        note = (f"same data, model, metric and space: their {len(results)} results are told to {told}; a config "
                f"they trained to R is not drawn again; {said}" if told else "same data, model, metric and "
                f"space; the random sampler learns nothing from results, so {_best(first)} drawn first; {said}")
    else:
        first = _interleave([[warm.clip(space, c) for c in warm.best_configs(rs, _directions(pf), k)]
                             for _, pf, rs in parents], k)
        why = "; ".join(f"{pid}: {w}" for pid, w in differ)
        if job.sampler == "priorband":
            space, changed = warm.with_priors(space, first[0])
            note = (f"{why}: the best config ({', '.join(changed) or 'none'}: no prior of yours) is the space's "
                    "prior" if changed else f"{why}: every parameter has your prior already; it stays")
            first = []
        else:
            note = f"{why}: {_best(first)} drawn first, clipped to this space"
    saved = {"parents": ids, "kind": kind, "note": f"warm start from {', '.join(ids)} ({kind}): {note}",
             "first": first, "space": space.to_dict(), "data": _data_line(mine, parents),
             "best": None if job.objectives else theirs}
    return dataclasses.replace(job, space=saved["space"], warm=saved)


def results(job: Job) -> list[warm.Result]:
    """The parents' results, read again where the sampler is to be told them (a new job, same data and space)."""
    return [(c, r, v) for pid in job.warm["parents"] for c, r, v, _ in _parent(job, pid)[2]] if job.warm else []


def _parent(job: Job, pid: str) -> tuple[str, dict[str, Any], list[tuple[Any, ...]]]:
    """A parent's id, facts and results (``warm.Result`` and the trial's id), from this job's store (its folder's
    root, or its storage URL)."""
    from prefect_hyperband.executors.schedulers import make_scheduler
    from prefect_hyperband.executors.state import job_store, load_job_record, load_state
    from prefect_hyperband.flows.say import in_run

    if pid == job.job_id:
        raise InputError(f"--warm-start {pid}: a job cannot start from itself")
    root = Path(job.job_dir).parent
    storage = job.storage[: -len(job.job_id)] + pid if job.storage else None
    record = load_job_record(job_store(root / pid, pid, storage), in_run)
    if record is None:
        raise InputError(f"--warm-start {pid}: no job {pid!r} under {storage or root} (expected {pid}/job.json)")
    pf = record.get("facts") or _old_facts(job, record)
    p = record["params"]
    parent = dataclasses.replace(
        job, job_id=pid, job_dir=str(root / pid), storage=storage, space=pf["space"], mode=p["mode"],
        sampler=p["sampler"], prior_first=p.get("prior_first", False), seed=p["seed"], min_resource=p["min_resource"],
        max_resource=p["max_resource"], eta=p["eta"], direction=pf["direction"],
        objectives=tuple(tuple(o) for o in pf["objectives"]), warm=record.get("warm"))
    found = load_state(parent, lambda raw: make_scheduler(parent, 1, None, lambda: 0.0, raw), in_run)
    if found is None:
        return pid, pf, []
    return pid, pf, [(t.config, r, v, t.trial_id) for t in found[1].records() for r, v in t.scores.items()]


def _parents_best(job: Job, found: list[tuple[str, dict[str, Any], list[tuple[Any, ...]]]]) -> dict[str, Any] | None:
    """The parents' best result (``job_id``, ``trial_id``, ``resource``, ``score``), ranked as the job ranks its
    own: kept in the warm plan, so the job's end (and a resume's, the parents since gone) compares with it."""
    scored = [(pid, tid, r, v) for pid, _, rs in found for _, r, v, tid in rs if not failed(v)]
    if not scored:
        return None
    top = min(scored, key=lambda x: (best_key(x[1], x[2], x[3], job.directions), x[0]))
    return {"job_id": top[0], "trial_id": top[1], "resource": top[2], "score": first_value(top[3])}


def overall_best(job: Job, best: dict[str, Any] | None) -> dict[str, Any] | None:
    """The best result of this job and its parents, for a job warm-started from the same data and space
    (SageMaker's ``OverallBestTrainingJob``): ``job_id``, ``trial_id``, ``resource``, ``score``, ranked as the job
    ranks its own (a tie goes to this job). None for a job not warm-started so (results on other data or another
    space do not compare), and with several objectives (their best is a front's choice, not one ranking)."""
    if not job.warm or job.warm["kind"] != "identical" or job.objectives:
        return None
    theirs = job.warm.get("best")  # None: a plan saved before it was kept
    mine = {"job_id": job.job_id, **{k: best[k] for k in ("trial_id", "resource", "score")}} if best else None
    if theirs is None or mine is None:
        return theirs or mine
    rank = lambda b: best_key(b["trial_id"], b["resource"], b["score"], job.directions)[:2]  # noqa: E731
    return theirs if rank(theirs) < rank(mine) else mine


def _old_facts(job: Job, record: dict[str, Any]) -> dict[str, Any]:
    """The facts of a job recorded before they were kept: worked out again from its parameters."""
    from prefect_hyperband.flows.search_space import job_objectives, job_space
    from prefect_hyperband.trainers.data import DataSpec

    saved = {k: v for k, v in record["params"].items() if k in TuneParams.model_fields}
    params = TuneParams(**{**saved, "resume": False, "warm_start": None})
    model = registry.get(params.model)
    space, _ = job_space(params, model)
    spec = DataSpec(data=params.data, target=params.target, validation_fraction=params.validation_fraction,
                    seed=params.seed)
    metric, direction, chosen = job_objectives(params, model, spec)
    then = dataclasses.replace(job, settings=dataclasses.replace(job.settings, model=params.model, data=spec),
                               metric=metric, direction=direction, objectives=chosen, space=space.to_dict())
    return facts(then, params)


def _directions(pf: dict[str, Any]) -> Any:
    return as_direction([d for _, d in pf["objectives"]]) if pf["objectives"] else pf["direction"]


def _difference(mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    """What makes a parent's results other than this job's would be ('' when nothing does)."""
    if mine["model"] != theirs["model"] or mine["code"] != theirs["code"]:
        return f"another model ({theirs['code'] or theirs['model']})"
    if mine["data"] != theirs["data"] or str(mine["data"]).startswith("unread"):
        return f"other data ({theirs.get('data_name')}, digest {theirs['data']} vs {mine['data']})"
    if (mine["metric"], mine["objectives"]) != (theirs["metric"], [list(o) for o in theirs["objectives"]]):
        return f"another metric ({theirs['metric']})"
    if mine["unit"] != theirs["unit"]:
        return "another unit of resource (" + ", ".join(f"{k} {v}" for k, v in theirs["unit"].items()) + ")"
    if not warm.same_space(parse(mine["space"]), parse(theirs["space"])):
        return "another space"
    return ""


def _best(first: list[Any]) -> str:
    return "their best config is" if len(first) == 1 else f"their {len(first)} best configs are"


def _interleave(lists: list[list[dict[str, Any] | None]], k: int) -> list[dict[str, Any]]:
    """Up to ``k`` distinct configs: each parent's best, then each one's second, ..."""
    out: dict[str, dict[str, Any]] = {}
    for i in range(max((len(x) for x in lists), default=0)):
        for configs in lists:
            if i < len(configs) and configs[i] is not None:
                out.setdefault(warm.config_key(configs[i]), configs[i])  # type: ignore[arg-type]
    return list(out.values())[:k]


def _data_line(mine: dict[str, Any], parents: list[tuple[str, dict[str, Any], Any]]) -> str:
    """The MLflow datasets compared, for the parent run's tag: each job's data and content digest."""
    said = lambda f: f"{f.get('data_name')} {f['data']}" if f["data"] else "no data set read"  # noqa: E731
    return "; ".join([f"this job: {said(mine)}", *(f"{pid}: {said(pf)}" for pid, pf, _ in parents)])


def sampler_for(job: Job, inner: Any) -> Any:
    """A new job's sampler, warm when the job is: told the parents' results (same data and space)."""
    if not job.warm:
        return inner
    observe = job.warm["kind"] == "identical" and job.sampler in ("tpe", "priorband")
    return warm.WarmSampler.start(inner, results(job) if observe else [], list(job.warm["first"]), job.max_resource,
                                  list(job.warm["parents"]), job.warm["kind"], observe)


__all__ = ["facts", "overall_best", "plan", "results", "sampler_for"]
