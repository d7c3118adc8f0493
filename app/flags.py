"""The CLI's flags, generated from the parameter models (``TuneParams``, the scaling study's, the schedule's) by
pydantic-settings: a field added to a model is a flag, its description the help, its ``metavar`` the value's name."""

from __future__ import annotations

import argparse
import re
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model

from prefect_hyperband.app import worker
from prefect_hyperband.flows.params import TYPE_METAVARS, TuneParams, field_facts

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a negative number is a value, in exponent form too (--target-score -1e-3): argparse 3.11 took it for a flag
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$", re.IGNORECASE)

    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        self.exit(EXIT_USAGE, f"hyperband: error: {message}\n")


def _command_base():
    """How a parameter model becomes flags (pydantic-settings, argparse underneath): ``--kebab-case``, ``--x`` and
    ``--no-x`` for a boolean, ``{a,b}`` for a Literal, and each flag's help is its field's description."""
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class Command(BaseSettings):
        model_config = SettingsConfigDict(cli_kebab_case=True, cli_implicit_flags=True, cli_hide_none_type=True,
                                          cli_avoid_json=True)

    return Command


def study_model() -> type:
    """``hyperband scale``'s own parameters (its ``workers`` is a list of sizes)."""
    class Study(BaseModel):
        model_config = ConfigDict(allow_inf_nan=False)  # as the job's own parameters

        workers: list[Annotated[int, Field(ge=1)]] = Field(
            [1, 2], min_length=1, description="Cluster sizes to compare, e.g. 1,2,4 (workers per trial).")
        target_score: Optional[float] = Field(None, description="Time to target: when a job's best-so-far reaches it "
                                              "(default: the tuned score at the smallest size, 0.01 worse).")
        tolerance: float = Field(0.005, ge=0, description="Sizes within this of the best tuned score count as good.")

    return Study


def _study_fields() -> dict[str, Any]:
    """The study's fields, for its generated flags."""
    return {name: (f.annotation, f) for name, f in study_model().model_fields.items()}


def _mount(parser: argparse.ArgumentParser, params_cls: type | None, **fields: Any) -> None:
    """Every field of ``params_cls`` (plus ``fields``, which replace or add) as a flag of ``parser``; the parsed
    namespace carries the source that reads them back as the fields given."""
    from pydantic_settings import CliSettingsSource

    base = _command_base()
    bases = (params_cls, base) if params_cls else (base,)
    command = create_model(f"{getattr(params_cls, '__name__', 'Schedule')}Flags", __base__=bases, **fields)
    parser.set_defaults(_fields=CliSettingsSource(command, root_parser=parser, add_argument_method=_add_argument))


def _add_argument(parser: argparse.ArgumentParser, *names: str, **kwargs: Any):
    """A flag as pydantic-settings builds it, its value named for what it is (its field's ``metavar``: PATH, URL,
    SECONDS, ...), not for its Python type; a choice keeps its {a,b,c}."""
    field = next((n[2:].replace("-", "_") for n in names if n.startswith("--")), "")
    shown, metavar = str(kwargs.get("metavar", "")), field_facts(field).get("metavar")
    if metavar and not shown.startswith("list[int]"):  # scale's --workers is a list of sizes
        kwargs["metavar"] = metavar
    elif shown in TYPE_METAVARS:
        kwargs["metavar"] = TYPE_METAVARS[shown]
    return parser.add_argument(*names, **kwargs)


def given(args: argparse.Namespace) -> dict[str, Any]:
    """The fields whose flags were given (the others keep the model's defaults), as pydantic-settings parsed them."""
    return dict(args._fields(parsed_args=args)())


def build_parser() -> argparse.ArgumentParser:
    """The CLI. ``tune``'s and ``scale``'s flags are generated from ``TuneParams``: a field
    added there is a flag here, with its description as the help."""
    parser = _Parser(prog="hyperband", description="Hyperband tuning as Prefect flows, tracked in MLflow.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser("plan", help="print the bracket schedule (Li et al., JMLR 2018, Table 1)")
    _mount(plan, None, **schedule_fields())
    plan.add_argument("--json", action="store_true", help="machine-readable output")

    deploy = sub.add_parser("deploy", help="put the bundled deployments on a work pool (needs PREFECT_API_URL)")
    deploy.add_argument("--pool", default="hyperband-process", help="work pool (create it first: prefect work-pool create NAME --type process)")
    deploy.add_argument("--name", action="append", default=[], help="a bundled deployment to deploy (repeatable; default: all)")
    deploy.add_argument("--working-dir", default=".", help="folder flow runs start in: job dirs and relative paths land there")
    deploy.add_argument("--no-schedule", action="store_true", help="leave out the example cron schedules")
    deploy.add_argument("--schedule-active", action="store_true",
                        help="turn the example cron schedules on (they are created paused)")
    deploy.add_argument("--show", action="store_true", help="print the bundled prefect.yaml's path and exit")

    tune = sub.add_parser("tune", help="run a tuning job; every flag is a TuneParams field")
    # the one flag spelled differently from its field: --resume JOB is resume=True with job_id=JOB
    _mount(tune, TuneParams, resume=(Optional[str], Field(None, description="Continue the job JOB (its folder under "
                                                          "job_dir) from its saved state; same as --job-id JOB with resume.")))
    _output_flags(tune)

    worker.add_parser(sub)
    study = sub.add_parser("scale", help="the tuning job at several cluster sizes: tuned vs transferred score, cost, speed")
    from pydantic_settings import CliSuppress

    _mount(study, TuneParams, resume=(CliSuppress[bool], False), **_study_fields())
    _output_flags(study)
    return parser


#: the fields ``hyperband plan`` takes: the schedule, and a trial's ranks with the GPUs they would take
SCHEDULE = ("min_resource", "max_resource", "eta", "workers", "gpus", "device")


def schedule_fields() -> dict[str, Any]:
    return {n: (f.annotation, f) for n, f in TuneParams.model_fields.items() if n in SCHEDULE}


def _output_flags(p: argparse.ArgumentParser) -> None:
    """How the command prints, not what the job does: not parameters of the job."""
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--verbose", action="store_true", help="also print Prefect's line per task run (always in the Prefect UI)")
