"""``hyperband deploy``: the bundled example deployments on a work pool, from the installed package.

The deployments are those of the packaged ``prefect.yaml`` (``prefect_hyperband.deployments``); the
entrypoint is the module path ``prefect_hyperband.flows.tune:tune``, so a worker needs the package
installed and nothing else: no checkout, no image, no remote storage (Prefect's ``EntrypointType.MODULE_PATH``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from prefect_hyperband.app.flags import EXIT_USAGE
from prefect_hyperband.common.errors import InputError

ENTRYPOINT = "prefect_hyperband.flows.tune:tune"
DEFAULT_POOL = "hyperband-process"


def prefect_yaml() -> Path:
    """The packaged ``prefect.yaml`` (a real file in an installed wheel or a checkout)."""
    return Path(str(resources.files("prefect_hyperband.deployments").joinpath("prefect.yaml")))


def bundled() -> list[dict[str, Any]]:
    """The deployments of the packaged ``prefect.yaml``, as written there."""
    return yaml.safe_load(prefect_yaml().read_text())["deployments"]


def choose(names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The bundled deployments called ``names`` (all when empty); an unknown name is an ``InputError``."""
    known = {d["name"]: d for d in bundled()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"unknown deployment {unknown[0]!r}; choose from {', '.join(known)}")
    return [known[n] for n in names] if names else list(known.values())


@dataclass(frozen=True)
class Deployed:
    name: str  # flow/deployment
    work_pool: str
    working_dir: str
    schedules: tuple[str, ...]
    active: bool = False


def deploy(
    pool: str = DEFAULT_POOL,
    working_dir: str | Path = ".",
    names: Sequence[str] = (),
    schedule: bool = True,
    active: bool = False,
) -> list[Deployed]:
    """Create or update the bundled deployments on ``pool``; flow runs start in ``working_dir``. Their example
    schedules are created paused unless ``active`` (none without ``schedule``).

    A process worker otherwise runs each flow run in a fresh temporary folder, where a job's
    checkpoints (``job_dir``, relative by default) would be lost and ``--resume`` impossible.
    """
    from prefect import deploy as prefect_deploy
    from prefect.deployments.runner import EntrypointType
    from prefect.schedules import Cron

    chosen = choose(names)
    workdir = Path(working_dir).resolve()
    if not workdir.is_dir():
        raise InputError(f"--working-dir {working_dir} is not a directory")
    deployments = []
    for d in chosen:
        # the pool's environment as the packaged prefect.yaml gives it (the Prefect client's retries, no telemetry)
        env = dict((d.get("work_pool") or {}).get("job_variables", {}).get("env") or {})
        job_variables = {"working_dir": str(workdir), "env": env}
        crons = [Cron(s["cron"], timezone=s.get("timezone"), active=active)
                 for s in d.get("schedules") or []] if schedule else []
        module, _, name = d["entrypoint"].partition(":")  # a module path: the tune flow, or the scaling study's
        flow = getattr(importlib.import_module(module), name)
        deployments.append(
            flow.to_deployment(
                name=d["name"],
                description=d.get("description"),
                tags=d.get("tags"),
                parameters=d.get("parameters"),
                schedules=crons or None,
                concurrency_limit=d.get("concurrency_limit"),
                job_variables=job_variables,
                entrypoint_type=EntrypointType.MODULE_PATH,
            )
        )
    prefect_deploy(*deployments, work_pool_name=pool, build=False, push=False, print_next_steps_message=False)
    return [
        Deployed(f"{d.flow_name}/{d.name}", pool, str(workdir), tuple(s.schedule.cron for s in d.schedules or []),
                 active)
        for d in deployments
    ]


def command(args: Any) -> int:
    """``hyperband deploy``: the bundled deployments on ``args.pool`` (``--show``: the packaged prefect.yaml's path)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if args.show:
        print(prefect_yaml())
        return 0
    from prefect.settings import PREFECT_API_URL

    try:
        choose(args.name)
    except InputError as exc:
        return _fail(str(exc))
    if not (os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()):
        return _fail("hyperband deploy needs a Prefect server: set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api)")
    try:
        done = deploy(args.pool, args.working_dir, args.name, schedule=not args.no_schedule,
                      active=args.schedule_active)
    except InputError as exc:
        return _fail(str(exc))
    except Exception as exc:  # an unknown pool, an unreachable server: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return _fail(f"deploy to pool {args.pool!r} failed: {type(exc).__name__}: {first}")
    for d in done:
        state = "on" if d.active else "paused: --schedule-active, or the UI's toggle, turns it on"
        cron = f", cron {', '.join(d.schedules)} ({state})" if d.schedules else ""
        print(f"deployed {d.name} on pool {d.work_pool} (runs start in {d.working_dir}{cron})")
    print(f"start a worker: prefect worker start --pool {args.pool}")
    return 0


def _fail(message: str) -> int:
    print(f"hyperband: error: {message}", file=sys.stderr)
    return EXIT_USAGE
