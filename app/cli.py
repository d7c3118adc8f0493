"""``hyperband plan``, ``tune``, ``scale``, ``deploy`` and ``worker``: bad input ends in one line and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError, create_model

from prefect_hyperband.app.deploy import command as deploy_command
from prefect_hyperband.app.flags import EXIT_USAGE, build_parser, given, schedule_fields, study_model
from prefect_hyperband.app.starting import FlowStart, started
from prefect_hyperband.app.streams import job_terminal
from prefect_hyperband.app.worker import main as serve_trial_rungs
from prefect_hyperband.common.errors import InputError, one_line
from prefect_hyperband.executors import progress
from prefect_hyperband.flows import process
from prefect_hyperband.flows.params import TuneParams
from prefect_hyperband.flows.process import ServerNotStarted, exit_without_stuck, start_timeout
from prefect_hyperband.hyperband.schedule import plan_summary, render_plan
from prefect_hyperband.hyperband.space import SpaceError
from prefect_hyperband.trainers import gpus, registry

#: the job stopped on something outside it that may come back (its Dask scheduler): ``--resume`` later (EX_TEMPFAIL)
EXIT_TEMPFAIL = 75


def main(argv: Sequence[str] | None = None) -> int:
    """The ``hyperband`` command."""
    from pydantic_settings import SettingsError

    args = build_parser().parse_args(argv)
    try:
        if args.command in ("deploy", "worker"):
            return deploy_command(args) if args.command == "deploy" else serve_trial_rungs(args)
        try:
            flags = given(args)
        except SettingsError as exc:  # a value the flag's type cannot take (a mapping that is not JSON)
            return _fail(_flags_in(str(exc).splitlines()[0]))
        if args.command == "plan":
            return _plan(flags, args)
        if args.command == "scale":
            return _scale(flags, args)
        return _tune(flags, args)
    except KeyboardInterrupt:
        print("hyperband: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The ``hyperband`` console script: ``main``, then an exit that leaves the process's heap to the OS. Python's
    last garbage collection over a job's objects (Prefect, MLflow, the trainers' libraries) took 1.6 s of the 1.9 s
    between a small job's summary and its exit (py-spy: ``gc_collect_main`` in the interpreter's finalisation);
    ``gc.freeze`` takes them out of it. Exit handlers still run (Prefect's workers drain, the temporary server stops,
    logging flushes) and the objects they make are collected as usual."""
    code = main()
    gc.freeze()
    sys.exit(code)


def _fail(message: str) -> int:
    print(f"hyperband: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _plan(flags: dict[str, Any], args: argparse.Namespace) -> int:
    try:
        values = create_model("Schedule", **schedule_fields())(**flags)
        plan = plan_summary(values.min_resource, values.max_resource, values.eta)
        ids = gpus.choose(values.device, values.gpus, values.workers)  # too few GPUs for a trial's ranks: one line
    except ValidationError as exc:
        return _fail(_one_line(exc))
    except InputError as exc:
        return _fail(str(exc))
    except ValueError as exc:
        return _fail(_flags_in(str(exc)))
    plan.update(gpus_per_trial=values.workers if ids else 0, gpus=list(ids or ()),
                trials_at_once_on_gpus=len(gpus.groups(ids, values.workers)) if ids else 0)
    if args.json:
        print(json.dumps(plan))
        return 0
    print(render_plan(plan))
    print(f"placement: {values.workers} GPU{'s' if values.workers > 1 else ''} a trial-rung (a rank per GPU), "
          f"{plan['trials_at_once_on_gpus']} at once on GPUs {','.join(map(str, ids))}" if ids else
          f"placement: the CPU, {values.workers} rank{'s' if values.workers > 1 else ''} a trial-rung"
          + (" (--device cpu)" if ids == () else " (no GPU visible here)"))
    return 0


def _env() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the client retries an API call the server answers 503 (a busy SQLite) a few more times than its default
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "10")
    # ... and 500: a Prefect server whose PostgreSQL restarts answers 500 until it is back (each job died of it)
    os.environ.setdefault("PREFECT_CLIENT_RETRY_EXTRA_CODES", "500")


def job_params(flags: dict[str, Any]):
    """The job's parameters from the flags given, validated by the model itself (``ValidationError``): ``--resume
    JOB`` is ``resume`` with ``job_id`` JOB, and a resume takes the saved job's parameters (``InputError`` for one
    that conflicts)."""
    from prefect_hyperband.flows.prepare import resolve

    flags = dict(flags)
    job = flags.pop("resume", None)
    if job:
        flags.update(resume=True, job_id=job)
    return resolve(TuneParams(**flags))


def _tune(flags: dict[str, Any], args: argparse.Namespace) -> int:
    _env()
    message = _model_error(flags)
    if message:
        return _fail(message)
    if flags.get("resume") and flags.get("job_id") not in (None, flags["resume"]):
        return _fail(f"--resume {flags['resume']} with --job-id {flags['job_id']}: give one")
    try:
        params = job_params(flags)
    except ValidationError as exc:
        return _fail(_one_line(exc))
    except InputError as exc:
        return _fail(str(exc))
    return _run(params, args)


def _model_error(flags: dict[str, Any]) -> str | None:
    """``--trainer`` with ``--script``, or an unknown ``--model``: the message, before anything else."""
    if flags.get("trainer") and flags.get("script"):
        return "--trainer and --script together: give one, a function or a script"
    models = registry.built_in()
    model = flags.get("model", TuneParams.model_fields["model"].default)
    if model not in models and not flags.get("trainer") and not flags.get("script"):
        return (f"unknown model {model!r}; choose {', '.join(models[:-1])} or {models[-1]}, "
                "or your own code with --trainer or --script")
    chosen = "script" if flags.get("script") else "function" if flags.get("trainer") else model
    workers = flags.get("workers") or 1  # (a list on `hyperband scale`: its largest)
    workers = max(workers) if isinstance(workers, (list, tuple)) else workers
    return registry.missing_extra(chosen, workers if isinstance(workers, int) else 1)


def _scale(flags: dict[str, Any], args: argparse.Namespace) -> int:
    """``hyperband scale``: every size checked before any training, then the study as one flow run."""
    from prefect_hyperband.flows.prepare import new_job_id

    _env()
    message = _model_error(flags)
    if message:
        return _fail(message)
    Study = study_model()
    study = {k: flags.pop(k) for k in Study.model_fields if k in flags}
    flags.pop("resume", None)
    try:
        study = Study(**study)
        params = job_params({**flags, "workers": study.workers[0]})
    except ValidationError as exc:
        return _fail(_one_line(exc))
    sizes = sorted(set(study.workers))
    params = params.model_copy(update={"job_id": params.job_id or new_job_id()})

    launched = process.launch_temporary_server()  # booting while every size is checked, as a tune's
    # a bad space or data, at the smallest size: one line of its own; then a size the machine cannot hold, named
    for n in [sizes[0], *sorted(sizes[1:], reverse=True)]:
        message = preflight(params.model_copy(update={"workers": n, "job_id": f"{params.job_id}-w{n}"}))
        if message:
            if launched is not None:
                launched.cancel()
            return _fail(message if n == sizes[0] or f"--workers {n}" in message else f"--workers {n}: {message}")
    from prefect_hyperband.app.terminal import quiet_terminal
    from prefect_hyperband.flows.scale import scale

    quiet_terminal()
    if _temporary_server(launched):
        return _exit(EXIT_TEMPFAIL)
    state = scale(params, sizes, study.target_score, study.tolerance, return_state=True)
    if state.is_cancelled():  # MLflow did not answer within --service-wait, or a job of the study stopped short
        print(f"hyperband: {state.message}", file=sys.stderr)
        return _exit(EXIT_TEMPFAIL)
    if not state.is_completed():
        print(f"hyperband: scaling study failed: {state.message}", file=sys.stderr)
        return _exit(1)
    result = state.result()
    if args.json:
        print(json.dumps({k: result[k] for k in ("rows", "cheapest", "fastest", "target", "metric", "study_run_id")},
                         default=str))
    else:
        print(result["table"])
        print(f"MLflow: experiment {params.experiment!r}, study run {result['study_run_id']} (each size's job nested under it)")
    return _exit(0)


def _resume_flags(params) -> str:
    storage = f" --storage {params.storage}" if params.storage else ""
    return f"--resume {params.job_id} --job-dir {params.job_dir}{storage}"


def _run(params, args: argparse.Namespace) -> int:
    if params.trial_pool:
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            return _fail(f"--trial-pool {params.trial_pool}: the pool's workers and this job need one Prefect server; "
                         "set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api after `prefect server start`)")
    from prefect_hyperband.flows.prepare import new_job_id

    launched = process.launch_temporary_server()  # Prefect's server boots while the job imports and checks its input
    params = params.model_copy(update={"job_id": params.job_id or new_job_id()})  # the preflight's and the flow's
    from prefect_hyperband.app.terminal import JobLog, job_log_path

    log = JobLog(verbose=args.verbose)  # MLflow's own lines from here on: the job's log file, not the terminal
    message = preflight(params)
    if message:
        log.close()
        if launched is not None:
            launched.cancel()
        return _fail(message)
    log.open(job_log_path(params))
    print(f"hyperband: job {params.job_id} in {params.job_dir}/{params.job_id} (resume with --resume {params.job_id}; "
          f"log: {log.path})", file=sys.stderr)
    from prefect_hyperband.flows.tune import tune

    with job_terminal(log.path) as out:  # every other write to stdout and stderr, in or under the job: job.log
        return _job(tune, params, args, launched, out)


def _job(tune, params, args: argparse.Namespace, launched, out) -> int:
    from prefect_hyperband.app.terminal import live_display, quiet_terminal

    live = None
    if not args.verbose:
        live = live_display()
        quiet_terminal(live=live is not None)
    if live is not None:
        progress.attach(live)
    if not params.resume:  # its writer's imports beside the server's start (a resume's parameters are the saved ones)
        from prefect_hyperband.tracking.writer import start_ahead

        start_ahead(_writer_ahead(params), params.service_wait)
    try:
        if _temporary_server(launched):  # stopped at exit, after Prefect's services have sent what they hold
            return _exit(EXIT_TEMPFAIL)  # it did not start within HYPERBAND_SERVER_START_TIMEOUT: said in one line
        # the heap of the imports and the set-up (some 460,000 objects) left out of the cyclic collector: a full
        # collection over it held the GIL 270 to 330 ms during the trials, every slot waiting; the CLI runs one job
        gc.freeze()
        state = started(FlowStart(tune, params), params)
        if state is None:  # the Prefect API could not start it within --service-wait: said in one line
            return _exit(EXIT_TEMPFAIL)
    except KeyboardInterrupt:  # Ctrl-C before or after the trials (the driver handles it during them)
        print(f"hyperband: interrupted; resume with {_resume_flags(params)}", file=sys.stderr)
        return 130
    finally:
        if live is not None:
            live.stop()
            progress.detach(live)
    return _ended(state, params, args, out)


def _writer_ahead(params) -> str:
    """The kind of MLflow writer the job will choose (``writer_for``), decided before its flow: with the slots it will
    resolve (given, or from the cores), except on a work pool or a Dask cluster, whose size the flow asks for."""
    from prefect_hyperband.tracking.writer import writer_for

    remote = params.trial_pool or params.dask_address
    slots = (params.concurrency or 1) if remote else params.trial_concurrency()
    return writer_for(slots, params.mode, params.max_trials, params.time_budget)


def _ended(state, params, args: argparse.Namespace, out=None) -> int:
    """The job's flow run ended: its summary (or JSON) on ``out`` (stdout), or one line on how it stopped; the exit code."""
    from prefect_hyperband.app import terminal

    out = out or sys.stdout
    if state.is_cancelled() and "stopped: " in (state.message or ""):  # not a signal: the cluster went away
        print(f"hyperband: {state.message}", file=sys.stderr)
        return _exit(EXIT_TEMPFAIL)
    if state.is_cancelled():
        named = re.search(r"stopped by (SIG[A-Z]+)", state.message or "")
        signum = signal.Signals[named.group(1)] if named else signal.SIGINT
        print(f"hyperband: job {params.job_id} stopped by {signal.Signals(signum).name}; resume with: "
              f"hyperband tune {_resume_flags(params)}", file=sys.stderr)
        return _exit(128 + signum)
    from prefect_hyperband.flows.ending import every_trial_failed

    failed = every_trial_failed(state)  # the flow run Failed, its summary written: shown, then one line, exit 2
    if not state.is_completed() and failed is None:
        error = state.result(raise_on_failure=False)
        if isinstance(error, InputError):  # refused inside the flow (a lock taken between preflight and start)
            return _exit(_fail(str(error)))
        print(f"hyperband: job failed: {state.message}", file=sys.stderr)
        return _exit(1)
    result = failed or state.result()
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "table"}, default=str), file=out)
    else:
        print(result["table"], file=out)
        print(f"MLflow: experiment {params.experiment!r}, parent run {result['parent_run_id']}; job dir {result['job_dir']}", file=out)
        print(f"MLflow UI: {terminal.mlflow_link(params, result['parent_run_id'])}", file=out)
        if result.get("champion_version"):  # this job's version: @champion, or @challenger (the summary says why)
            alias = result.get("model_alias") or "champion"
            print(f"{alias}: models:/{params.experiment}@{alias} (version {result['champion_version']})", file=out)
    if failed:  # nothing tuned: the user's code (or data) fails, not a job to build on
        print(f"hyperband: error: every trial failed ({result['summary']['failed_trials']}), the first with "
              f"{result['every_trial_failed']} (each traceback: {Path(result['job_dir']) / 'job.log'}); fix it and run the "
              "job again", file=sys.stderr)
        return _exit(2)
    return _exit(0)


def _exit(code: int) -> int:
    return exit_without_stuck(code)


def _temporary_server(launched=None) -> bool:
    """Prefect's temporary server started (or none needed): False; it did not start: one line, True."""
    try:
        process.temporary_server(launched)
    except ServerNotStarted as exc:
        print(f"hyperband: error: {exc}", file=sys.stderr)
        return True
    return False


def preflight(params) -> str | None:
    """Everything that can be wrong with the input, checked before any training; a message or None."""
    from prefect_hyperband.flows.prepare import new_job_id, prepare

    try:
        start_timeout()  # HYPERBAND_SERVER_START_TIMEOUT, a number of seconds
        prepare(params.model_copy(update={"job_id": params.job_id or new_job_id()}))
    except (InputError, SpaceError, ValueError) as exc:
        return str(exc)
    except ConnectionError as exc:
        return str(exc)
    except Exception as exc:  # the tracking store and other I/O: name it, no traceback
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def _one_line(exc) -> str:
    """A ``ValidationError`` as one line, each field named by its flag, with the value given."""
    return one_line(exc, name=lambda field: "--" + field.replace("_", "-"), across=_flags_in)


def _flags_in(message: str) -> str:
    """A check across fields names them as Python and the Prefect form do (``min_resource``); on the command line,
    each as its flag (``--min-resource``), as is a value pydantic-settings could not parse."""
    parsed = re.match(r"Parsing error encountered for (\w+): (.*)", message)  # pydantic-settings' line for a flag
    if parsed:
        return f"--{parsed.group(1).replace('_', '-')}: cannot parse its value: {parsed.group(2)}"
    named = "|".join(sorted((f for f in TuneParams.model_fields if "_" in f), key=len, reverse=True))
    return re.sub(rf"\b({named})\b", lambda m: "--" + m.group(1).replace("_", "-"), message)


if __name__ == "__main__":
    run()
