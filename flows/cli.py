"""``hyperband plan``, ``hyperband tune`` and ``hyperband deploy``: bad input ends in one line and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Sequence

from prefect_hyperband.trainers.errors import InputError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(EXIT_USAGE, f"hyperband: error: {message}\n")


def _positive(name: str, minimum: int = 1):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be an integer >= {minimum}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hyperband", description="Hyperband tuning as Prefect flows, tracked in MLflow.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser("plan", help="print the bracket schedule (Li et al., JMLR 2018, Table 1)")
    _schedule_flags(plan)
    plan.add_argument("--json", action="store_true", help="machine-readable output")

    deploy = sub.add_parser("deploy", help="put the bundled deployments on a work pool (needs PREFECT_API_URL)")
    deploy.add_argument("--pool", default="hyperband-process", help="work pool (create it first: prefect work-pool create NAME --type process)")
    deploy.add_argument("--name", action="append", default=[], help="a bundled deployment to deploy (repeatable; default: all)")
    deploy.add_argument("--working-dir", default=".", help="folder flow runs start in: job dirs and relative paths land there")
    deploy.add_argument("--no-schedule", action="store_true", help="leave out the example cron schedules")
    deploy.add_argument("--show", action="store_true", help="print the bundled prefect.yaml's path and exit")

    tune = sub.add_parser("tune", help="run a tuning job")
    _schedule_flags(tune)
    _job_flags(tune)
    tune.add_argument("--resume", metavar="JOB", help="continue job JOB (its folder under --job-dir) from its saved state")
    tune.add_argument("--workers", type=_positive("--workers"), default=1, help="workers per trial")

    study = sub.add_parser("scale", help="the tuning job at several cluster sizes: tuned vs transferred score, cost, speed")
    _schedule_flags(study)
    _job_flags(study)
    study.add_argument("--workers", type=_worker_list, default=[1, 2], help="cluster sizes to compare, e.g. 1,2,4 (workers per trial)")
    study.add_argument("--target-score", type=float, help="time to target: when a job's best-so-far reaches it "
                       "(default: the tuned score at the smallest size, 0.01 worse)")
    study.add_argument("--tolerance", type=float, default=0.005, help="sizes within this of the best tuned score count as good")
    return parser


def _job_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a tuning job, shared by ``tune`` and ``scale``."""
    p.add_argument("--model", default="xgboost", help="a built-in model: xgboost, torch or synthetic (or a registered plug-in)")
    p.add_argument("--trainer", help="your training function: path/to/file.py:function or package.module:function")
    p.add_argument("--script", help="your training script, run as python -m torch.distributed.run --nproc-per-node WORKERS SCRIPT --name value ...")
    p.add_argument("--direction", choices=["minimize", "maximize"], help="with --trainer or --script: is the metric better smaller or larger")
    p.add_argument("--mode", default="hyperband", choices=["hyperband", "asha"], help="synchronous brackets or ASHA")
    p.add_argument("--sampler", default="random", choices=["random", "tpe"], help="how configs are proposed")
    p.add_argument("--max-trials", type=_positive("--max-trials"), help="asha: configs to start (default: as Hyperband)")
    p.add_argument("--time-budget", type=float, help="asha: seconds after which no new trial starts")
    p.add_argument("--data", default="bank-marketing", help="bank-marketing, digits, breast-cancer or a CSV path")
    p.add_argument("--target", help="target column of a CSV file")
    p.add_argument("--metric", help="auc, accuracy, rmse or logloss (default: from the target)")
    p.add_argument("--space", help="YAML search space (default: the model's own)")
    p.add_argument("--seed", type=_positive("--seed", 0), default=0)
    p.add_argument("--concurrency", type=_positive("--concurrency", 0), default=0, help="trials at once (0: auto)")
    p.add_argument("--dask-address", help="tcp://host:8786 of an existing Dask scheduler")
    p.add_argument("--rounds-per-unit", type=_positive("--rounds-per-unit"), default=10, help="XGBoost rounds per resource unit")
    p.add_argument("--unit-seconds", type=float, default=0.0, help="synthetic: seconds one unit takes")
    p.add_argument("--trial-timeout", type=float, help="seconds a trial-rung may take before its trial fails "
                      "(default: 20x the job's measured seconds per unit, at least 300)")
    p.add_argument("--job-dir", default="hyperband-jobs", help="local folder of the job (its lock and reports; its "
                      "checkpoints and state too, unless --storage is a URL)")
    p.add_argument("--storage", metavar="URL", help="where checkpoints and job state live: a local or shared folder, "
                      "or s3://bucket/prefix, gs://... (default: --job-dir)")
    p.add_argument("--trial-pool", metavar="POOL", help="Prefect work pool whose workers run the trial-rungs "
                      "(needs PREFECT_API_URL and --storage that the workers reach)")
    p.add_argument("--job-id", help="name of this job's folder (default: time-stamped)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    p.add_argument("--experiment", default="hyperband", help="MLflow experiment and registered model name")
    p.add_argument("--no-register", action="store_true", help="do not register the best model")
    p.add_argument("--no-baseline", action="store_true", help="skip training the default config to R")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--verbose", action="store_true", help="also print Prefect's line per task run (always in the Prefect UI)")


def _worker_list(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers must be a comma-separated list of counts, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--workers must list counts >= 1, got {text!r}")
    return sorted(set(sizes))


def _schedule_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--min-resource", type=_positive("--min-resource"), default=1, help="r (default 1)")
    p.add_argument("--max-resource", type=_positive("--max-resource"), default=81, help="R (default 81)")
    p.add_argument("--eta", type=_positive("--eta", 2), default=3, help="η (default 3)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "plan":
            return _plan(args)
        if args.command == "deploy":
            return _deploy(args)
        if args.command == "scale":
            return _scale(args)
        return _tune(args)
    except KeyboardInterrupt:
        print("hyperband: interrupted", file=sys.stderr)
        return 130


def _fail(message: str) -> int:
    print(f"hyperband: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _plan(args: argparse.Namespace) -> int:
    from prefect_hyperband.hyperband.schedule import plan_summary

    try:
        plan = plan_summary(args.min_resource, args.max_resource, args.eta)
    except ValueError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(plan))
        return 0
    print(render_plan(plan))
    return 0


def _deploy(args: argparse.Namespace) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect_hyperband.flows import deploy

    if args.show:
        print(deploy.prefect_yaml())
        return 0
    from prefect.settings import PREFECT_API_URL

    from prefect_hyperband.trainers.errors import InputError

    try:
        deploy.choose(args.name)
    except InputError as exc:
        return _fail(str(exc))
    if not (os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()):
        return _fail("hyperband deploy needs a Prefect server: set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api)")
    try:
        done = deploy.deploy(args.pool, args.working_dir, args.name, schedule=not args.no_schedule)
    except InputError as exc:
        return _fail(str(exc))
    except Exception as exc:  # an unknown pool, an unreachable server: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _fail(f"deploy to pool {args.pool!r} failed: {type(exc).__name__}: {first}")
    for d in done:
        cron = f", cron {', '.join(d.schedules)}" if d.schedules else ""
        print(f"deployed {d.name} on pool {d.work_pool} (runs start in {d.working_dir}{cron})")
    print(f"start a worker: prefect worker start --pool {args.pool}")
    return 0


def render_plan(plan: dict[str, Any]) -> str:
    lines = [f"Hyperband plan: r={plan['min_resource']}, R={plan['max_resource']}, eta={plan['eta']} (s_max={plan['s_max']})"]
    depth = max(len(b["rungs"]) for b in plan["brackets"])
    header = ["bracket"] + [f"rung {i}" for i in range(depth)] + ["units"]
    rows = [header]
    for b in plan["brackets"]:
        cells = [f"s={b['s']}"] + [f"{r['n_configs']} @ {r['resource']}" for r in b["rungs"]]
        rows.append(cells + [""] * (depth + 1 - len(cells)) + [str(b["resource_used"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append(
        f"{plan['configs']} configs, {plan['trial_rungs']} trial-rungs, {plan['reach_max_resource']} reach R; "
        f"resource {plan['resource_used']:,} units with early stopping and resume "
        f"({plan['resource_from_scratch']:,} if promotions retrained from scratch) vs "
        f"{plan['resource_without_early_stopping']:,} training every config to R"
    )
    return "\n".join(lines)


def _tune(args: argparse.Namespace) -> int:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    # the client retries an API call the server answers 503 (a busy SQLite) a few more times than its default
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "10")
    from pydantic import ValidationError

    message = _model_error(args)
    if message:
        return _fail(message)
    if args.resume:
        from prefect_hyperband.flows.job import resume_params
        from prefect_hyperband.trainers.errors import InputError

        try:
            return _run(resume_params(args.job_dir, args.resume, _explicit(args)), args)
        except (InputError, ValidationError) as exc:
            return _fail(_one_line(exc) if isinstance(exc, ValidationError) else str(exc))
    try:
        params = _params(args, args.workers)
    except ValidationError as exc:
        return _fail(_one_line(exc))
    return _run(params, args)


def _model_error(args: argparse.Namespace) -> str | None:
    """``--trainer`` with ``--script``, or an unknown ``--model``: the message, before anything else."""
    from prefect_hyperband.trainers import registry

    if args.trainer and args.script:
        return "--trainer and --script together: give one, a function or a script"
    models = registry.built_in()
    if args.model not in models and not args.trainer and not args.script:
        return (f"unknown model {args.model!r}; choose {', '.join(models[:-1])} or {models[-1]}, "
                "or your own code with --trainer or --script")
    return None


def _params(args: argparse.Namespace, workers: int):
    """The job's TuneParams from the flags (``ValidationError`` for a bad combination); ``--trainer`` or
    ``--script`` sets the model (TuneParams' own rule)."""
    from prefect_hyperband.flows.params import TuneParams

    return TuneParams(
        model=args.model, trainer=args.trainer, script=args.script, direction=args.direction, data=args.data,
        target=args.target, metric=args.metric, space=args.space,
        min_resource=args.min_resource, max_resource=args.max_resource, eta=args.eta, seed=args.seed,
        workers=workers, concurrency=args.concurrency, dask_address=args.dask_address,
        rounds_per_unit=args.rounds_per_unit, storage=args.storage, trial_pool=args.trial_pool,
        job_dir=args.job_dir, job_id=args.job_id, tracking_uri=args.tracking_uri, experiment=args.experiment,
        register_model=not args.no_register, baseline=not args.no_baseline,
        mode=args.mode, sampler=args.sampler, trial_timeout=args.trial_timeout, unit_seconds=args.unit_seconds,
        max_trials=args.max_trials, time_budget=args.time_budget,
    )


def _scale(args: argparse.Namespace) -> int:
    """``hyperband scale``: every size checked before any training, then the study as one flow run."""
    from pydantic import ValidationError

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "10")
    message = _model_error(args)
    if message:
        return _fail(message)
    if not 0 <= args.tolerance:
        return _fail(f"--tolerance must be >= 0, got {args.tolerance}")
    study = args.job_id or _job_id()
    try:
        params = _params(args, args.workers[0]).model_copy(update={"job_id": study})
        for n in sorted(args.workers, reverse=True):  # a size the machine cannot hold, a bad space: now, one line
            message = preflight(params.model_copy(update={"workers": n, "job_id": f"{study}-w{n}"}))
            if message:
                return _fail(message if f"--workers {n}" in message else f"--workers {n}: {message}")
    except ValidationError as exc:
        return _fail(_one_line(exc))
    from prefect_hyperband.flows.scale import scale

    quiet_terminal()
    _temporary_server()
    state = scale(params, args.workers, args.target_score, args.tolerance, return_state=True)
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


#: tune flags whose names differ from their TuneParams field (or are not one)
_FLAG_FIELDS = {"no_register": "register_model", "no_baseline": "baseline"}
_NOT_PARAMS = {"command", "resume", "json", "verbose", "job_dir"}


def _explicit(args: argparse.Namespace) -> dict[str, Any]:
    """The tune flags given on the command line (values that differ from the parser's defaults), as TuneParams fields."""
    from prefect_hyperband.trainers import registry

    defaults = {a.dest: a.default for a in _tune_parser()._actions}
    user_code = registry.user_code_fields()  # --trainer, --script: their field, and the model they set
    out: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if dest in _NOT_PARAMS or dest not in defaults or value == defaults[dest]:
            continue
        if dest in _FLAG_FIELDS:
            out[_FLAG_FIELDS[dest]] = not value
        elif dest in user_code:
            out.update({dest: value, "model": user_code[dest]})
        else:
            out[dest] = value
    return out


def _tune_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["tune"]


def _resume_flags(params) -> str:
    storage = f" --storage {params.storage}" if params.storage else ""
    return f"--resume {params.job_id} --job-dir {params.job_dir}{storage}"


def _run(params, args: argparse.Namespace) -> int:
    if params.trial_pool:
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            return _fail(f"--trial-pool {params.trial_pool}: the pool's workers and this job need one Prefect server; "
                         "set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api after `prefect server start`)")
    message = preflight(params)
    if message:
        return _fail(message)
    params = params.model_copy(update={"job_id": params.job_id or _job_id()})
    print(f"hyperband: job {params.job_id} in {params.job_dir}/{params.job_id} (resume with --resume {params.job_id})", file=sys.stderr)
    from prefect_hyperband.flows.tune import tune

    live = None
    if not args.verbose:
        live = _live_display()
        quiet_terminal(live=live is not None)
    if live is not None:
        from prefect_hyperband.flows import progress

        progress.attach(live)
    _temporary_server()  # stopped at exit, after Prefect's services have sent what they hold
    try:
        state = tune(params, return_state=True)
    except KeyboardInterrupt:  # Ctrl-C before or after the trials (the driver handles it during them)
        print(f"hyperband: interrupted; resume with {_resume_flags(params)}", file=sys.stderr)
        return 130
    finally:
        if live is not None:
            live.stop()
            progress.detach(live)
    if state.is_cancelled():
        import re
        import signal

        named = re.search(r"stopped by (SIG[A-Z]+)", state.message or "")
        signum = signal.Signals[named.group(1)] if named else signal.SIGINT
        print(f"hyperband: job {params.job_id} stopped by {signal.Signals(signum).name}; resume with: "
              f"hyperband tune {_resume_flags(params)}", file=sys.stderr)
        return _exit(128 + signum)
    if not state.is_completed():
        from prefect_hyperband.trainers.errors import InputError

        error = state.result(raise_on_failure=False)
        if isinstance(error, InputError):  # refused inside the flow (a lock taken between preflight and start)
            return _exit(_fail(str(error)))
        print(f"hyperband: job failed: {state.message}", file=sys.stderr)
        return _exit(1)
    result = state.result()
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "table"}, default=str))
    else:
        print(result["table"])
        print(f"MLflow: experiment {params.experiment!r}, parent run {result['parent_run_id']}; job dir {result['job_dir']}")
        if result.get("champion_version"):
            print(f"champion: models:/{params.experiment}@champion (version {result['champion_version']})")
    return _exit(0)


def _exit(code: int) -> int:
    from prefect_hyperband.flows.process import exit_without_stuck

    return exit_without_stuck(code)


def _temporary_server():
    from prefect_hyperband.flows.process import temporary_server

    return temporary_server()


def _live_display():
    """The live progress display when stderr is a terminal (``HYPERBAND_NO_LIVE=1`` turns it off); else None."""
    if not sys.stderr.isatty() or os.environ.get("HYPERBAND_NO_LIVE") == "1" or os.environ.get("TERM") == "dumb":
        return None
    from prefect_hyperband.flows.progress import LiveDisplay

    return LiveDisplay(sys.stderr)


class _TerminalFilter:
    """The terminal shows the job's own lines; each task run's lines stay in the Prefect UI (``--verbose``: both).
    Under the live display, only warnings and errors: the display shows the progress the info lines tell."""

    def __init__(self, live: bool = False) -> None:
        self.live = live

    def filter(self, record) -> bool:
        if record.name.startswith("prefect.task_runs") and record.levelno < 30:  # below WARNING
            return False
        if self.live and record.name.startswith("prefect.flow_runs") and record.levelno < 30:
            return False
        if record.exc_info and isinstance(record.exc_info[1], InputError):  # the CLI says it in one line, exit 2
            return False
        return getattr(record, "hyperband_terminal", True)  # the summary: printed by the CLI itself


def quiet_terminal(live: bool = False) -> None:
    import logging

    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    setup_logging()  # idempotent: Prefect's handlers exist before the filter goes on them
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            for old in [f for f in handler.filters if isinstance(f, _TerminalFilter)]:
                handler.removeFilter(old)
            handler.addFilter(_TerminalFilter(live))


def preflight(params) -> str | None:
    """Everything that can be wrong with the input, checked before any training; a message or None."""
    from prefect_hyperband.hyperband.space import SpaceError
    from prefect_hyperband.trainers.errors import InputError

    from prefect_hyperband.flows.job import prepare

    try:
        prepare(params.model_copy(update={"job_id": params.job_id or _job_id()}))
    except (InputError, SpaceError, ValueError) as exc:
        return str(exc)
    except ConnectionError as exc:
        return str(exc)
    except Exception as exc:  # the tracking store and other I/O: name it, no traceback
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


_JOB_ID: list[str] = []


def _job_id() -> str:
    """One id per process, so the preflight and the flow use the same job folder."""
    if not _JOB_ID:
        from prefect_hyperband.flows.job import new_job_id

        _JOB_ID.append(new_job_id())
    return _JOB_ID[0]


def _one_line(exc) -> str:
    errors = exc.errors()
    parts = []
    for e in errors:
        field = ".".join(str(x) for x in e.get("loc", ())) or "parameters"
        parts.append(f"{field}: {e.get('msg', '')}".replace("Value error, ", ""))
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
