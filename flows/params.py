"""The job's parameters: one typed model, so the Prefect UI renders them as a form and errors name the field."""

from __future__ import annotations

import os
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prefect_hyperband.flows import objectives
from prefect_hyperband.hyperband.warm import MAX_PARENTS
from prefect_hyperband.trainers import registry
from prefect_hyperband.trainers.xgboost.config import ROUNDS_PER_UNIT

#: A field's own facts beside its type and description, in ``json_schema_extra`` (the one place they are written):
#: ``metavar``, what ``--help`` calls its value (PATH, URL, SECONDS...; ``app.cli``); ``on_resume: may change``,
#: a field a resume may set to another value than the job's (``flows.prepare.resolve``; the others are refused);
#: ``mlflow: param``, a field the parent run logs as a param (``flows.tune``: its value as the job resolved it).
#: The word for a value of a type, where a field has no ``metavar``:
TYPE_METAVARS = {"int": "N", "float": "X", "str": "TEXT", "list[int]": "N,N,...", "list[str]": "TEXT"}


def field_facts(name: str) -> dict[str, Any]:
    """``name``'s facts (``metavar``, ``on_resume``) from its field; {} for a flag that is no ``TuneParams`` field."""
    field = TuneParams.model_fields.get(name)
    extra = field.json_schema_extra if field is not None else None
    return dict(extra) if isinstance(extra, dict) else {}


def may_change_on_resume() -> frozenset[str]:
    """The fields a resume may change (``on_resume: may change``): where and how the job runs, not what it tunes."""
    return frozenset(n for n in TuneParams.model_fields if field_facts(n).get("on_resume") == "may change")


def mlflow_params() -> tuple[str, ...]:
    """The fields the job's parent run logs as params (``mlflow: param``), in the model's order."""
    return tuple(n for n in TuneParams.model_fields if field_facts(n).get("mlflow") == "param")


class TuneParams(BaseModel):
    """A Hyperband tuning job (Li et al., JMLR 2018): r = min_resource, R = max_resource, η = eta."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a NaN or an infinite number: refused

    model: Literal[registry.names()] = Field(  # type: ignore[valid-type]  (the registered models: a UI dropdown)
        "xgboost", description="Model family to tune; function: your own training function (set trainer); "
        "script: your own training script (set script)."
    ,
        json_schema_extra={"mlflow": "param"})
    trainer: Optional[str] = Field(
        None, description="Your training function: path/to/file.py:function or package.module:function (sets model=function).",
        json_schema_extra={"metavar": "FILE.py:FUNC|MODULE:FUNC"}
    )
    script: Optional[str] = Field(
        None, description="Your training script, run under torch's launcher with --workers ranks (sets model=script).",
        json_schema_extra={"metavar": "PATH"}
    )
    direction: Optional[Literal["minimize", "maximize"]] = Field(
        None, description="Whether the metric is better smaller or larger; required with your own trainer."
    )
    mode: Literal["hyperband", "asha"] = Field(
        "hyperband", description="hyperband: synchronous brackets (Li et al. 2018); asha: asynchronous (Li et al. 2020)."
    ,
        json_schema_extra={"mlflow": "param"})
    sampler: Literal["random", "tpe", "priorband"] = Field(
        "random", description="random; Optuna's TPE fitted per rung (BOHB); or priorband: the space's priors, "
        "uniform and the incumbent in PriorBand's proportions (Mallik et al. 2023)."
    ,
        json_schema_extra={"mlflow": "param"})
    prior_first: bool = Field(
        False, description="Train the space's priors (each parameter at its prior; one without, at the middle of its "
        "range) straight to R before the brackets, as PriorBand did when published (NePS's sample_prior_first)."
    )
    max_trials: Optional[int] = Field(None, ge=1, description="asha: configs to start (default: as many as Hyperband).")
    time_budget: Optional[float] = Field(
        None, gt=0, description="Seconds after which the job starts nothing new: hyperband, no trial-rung; asha, no "
        "config (those started are promoted on).", json_schema_extra={"metavar": "SECONDS", "on_resume": "may change"})
    target_score: Optional[float] = Field(
        None, description="Stop once a result reaches this score (the metric; of several objectives, the first) at "
        "target_resource or above: no new trial-rung, those in flight finish.",
        json_schema_extra={"metavar": "VALUE", "on_resume": "may change"})
    target_resource: Optional[int] = Field(
        None, ge=1, description="The resource from which a result counts for target_score; default R.",
        json_schema_extra={"metavar": "N", "on_resume": "may change"})
    patience: Optional[int] = Field(
        None, ge=1, description="Stop once this many results at R in a row bring no new best at R.",
        json_schema_extra={"metavar": "N", "on_resume": "may change"})
    max_cost: Optional[float] = Field(
        None, gt=0, description="Stop once this many worker-seconds are spent (trainings and evaluations, lost ones "
        "included).", json_schema_extra={"metavar": "SECONDS", "on_resume": "may change"})
    warm_start: Optional[list[str]] = Field(
        None, max_length=MAX_PARENTS, description="Earlier jobs of this job_dir (or storage) to start from, at most 5: on the "
        "same data, model and space their results teach TPE or PriorBand (random: their best configs go first); "
        "otherwise their best configs, clipped to the space, go first (PriorBand: they become the priors).",
        json_schema_extra={"mlflow": "param", "metavar": "JOB"})
    importance: Literal["ped-anova", "fanova", "none"] = Field(
        "ped-anova", description="Which hyperparameters mattered, after the job: Optuna's PED-ANOVA or fANOVA on the "
        "results of the highest rung with enough of them (on the parent run, the flow run and in the summary).",
        json_schema_extra={"on_resume": "may change"})
    data: str = Field(
        "bank-marketing",
        description="bank-marketing (bundled), digits, breast-cancer, or a table: a CSV (comma/semicolon, optionally "
        ".gz) or Parquet file, a folder or a glob of them, local or an fsspec URL (s3://bucket/table/).",
        json_schema_extra={"mlflow": "param", "metavar": "NAME|PATH|URL"}
    )
    target: Optional[str] = Field(None, description="Target column of a CSV or Parquet table.",
        json_schema_extra={"metavar": "COLUMN"})
    allow_data_change: bool = Field(False, description="Resume a job whose data changed since it began (its files' "
        "names, sizes or stamps), with the data as it is now; without it such a resume is refused.",
        json_schema_extra={"on_resume": "may change"})
    # a string too in the schema (a deployment's or the UI form's one metric); always a list once validated
    metric: Optional[Union[list[str], str]] = Field(
        None, description="The metric to tune: auc, accuracy, rmse or logloss (default from the target), or your "
        "trainer's. Give it again for several objectives, each name:max or name:min (e.g. --metric auc --metric "
        "predict_ms:min): the built-ins also report train_seconds, predict_ms (per 1,000 validation rows) and "
        "model_bytes.", json_schema_extra={"mlflow": "param", "metavar": "NAME[:max|min]"}
    )
    select: str = Field(
        "first", description="Several objectives: the champion on the Pareto front; first (the best first "
        "objective), knee, or a constraint like predict_ms<=2 (the best first objective among those meeting it).",
        json_schema_extra={"metavar": "first|knee|NAME<=VALUE"}
    )
    space: Optional[Union[str, dict[str, dict[str, Any]]]] = Field(
        None, description="YAML search space file, or the space itself; default: the model's own.",
        json_schema_extra={"mlflow": "param", "metavar": "PATH|JSON"}
    )
    min_resource: int = Field(1, ge=1, description="r: resource of the smallest rung.",
        json_schema_extra={"mlflow": "param"})
    max_resource: int = Field(81, ge=1, description="R: resource of a trial trained to the end.",
        json_schema_extra={"mlflow": "param"})
    eta: int = Field(3, ge=2, description="η: keep the best 1/η of each rung.",
        json_schema_extra={"mlflow": "param"})
    seed: int = Field(0, ge=0, description="Same seed, same configs, brackets and promotions.",
        json_schema_extra={"mlflow": "param"})
    workers: int = Field(1, ge=1, description="Workers per trial (Dask allreduce for XGBoost, DDP ranks for torch).",
        json_schema_extra={"mlflow": "param", "metavar": "N"})
    gpus: Optional[str] = Field(None, description="GPUs a host's trials take, by CUDA id (e.g. 0,1,2,3): a "
        "trial-rung of N workers takes N of them (a rank per GPU), trials at once on disjoint GPUs; default: every "
        "GPU visible here.", json_schema_extra={"mlflow": "param", "metavar": "IDS", "on_resume": "may change"})
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="cpu keeps a GPU machine's trials on its CPU; "
        "cuda needs a GPU; auto: the GPUs where there are any.",
        json_schema_extra={"mlflow": "param", "on_resume": "may change"})
    precision: Literal["fp32", "bf16"] = Field("fp32", description="torch: bf16 trains the forward pass under "
        "autocast to bfloat16 (GPUs with bf16: H100, H200, A100; the weights stay float32).",
        json_schema_extra={"mlflow": "param"})
    deterministic: bool = Field(False, description="torch: deterministic cuDNN and torch algorithms "
        "(CUBLAS_WORKSPACE_CONFIG set): a GPU trial resumed equals one trained straight, at some speed.",
        json_schema_extra={"mlflow": "param"})
    concurrency: int = Field(0, ge=0, description="Trials trained at once; 0 picks from the cores and workers.",
        json_schema_extra={"mlflow": "param", "on_resume": "may change"})
    dask_address: Optional[str] = Field(None, description="tcp://host:8786 of an existing Dask scheduler.",
        json_schema_extra={"mlflow": "param", "metavar": "URL", "on_resume": "may change"})
    rounds_per_unit: int = Field(ROUNDS_PER_UNIT, ge=1, description="XGBoost: boosting rounds per resource unit.",
        json_schema_extra={"mlflow": "param"})
    external_memory: bool = Field(
        False, description="XGBoost on this machine (no Dask): train a table read in parts from disk, through "
        "XGBoost's external memory (a table bigger than memory; chosen by itself when its files exceed half the "
        "machine's memory).", json_schema_extra={"mlflow": "param"})
    unit_seconds: float = Field(0.0, ge=0.0, description="synthetic: seconds one unit takes (an emulated cost).",
        json_schema_extra={"mlflow": "param", "metavar": "SECONDS"})
    trial_timeout: Optional[float] = Field(
        None, gt=0, description="Seconds a trial-rung may take before its trial fails; default: 20x its measured pace, at least 300.",
        json_schema_extra={"metavar": "SECONDS", "on_resume": "may change"}
    )
    service_wait: float = Field(
        300.0, gt=0, description="Seconds to wait for a service that does not answer: the Prefect API while it cannot "
        "start the job's flow run (its server or database restarting), MLflow's server while it answers 5xx or is "
        "gone (its client's retries are set to about this long, unless MLFLOW_HTTP_REQUEST_MAX_RETRIES is set); "
        "past it, one line and exit 75.",
        json_schema_extra={"metavar": "SECONDS", "on_resume": "may change"}
    )
    validation_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of rows held out for validation.",
        json_schema_extra={"metavar": "FRACTION"})
    job_dir: str = Field("hyperband-jobs", description="Local folder of the job (its lock, its report files; "
                         "its checkpoints and state too unless storage is a URL).",
        json_schema_extra={"metavar": "PATH", "on_resume": "may change"})
    storage: Optional[str] = Field(
        None, description="Where checkpoints and job state live: a local or shared folder, or an fsspec URL "
        "(s3://bucket/prefix, gs://...); default: job_dir. Trial-pool workers on other machines need it shared.",
        json_schema_extra={"mlflow": "param", "metavar": "PATH|URL"}
    )
    trial_pool: Optional[str] = Field(
        None, description="Prefect work pool whose workers run the trial-rungs (one hyperband-trial flow run each); "
        "default: this process.", json_schema_extra={"mlflow": "param", "metavar": "POOL", "on_resume": "may change"}
    )
    task_workers: bool = Field(
        False, description="Trial-rungs as background task runs that `hyperband worker` processes take, on any "
        "machine (warm: no process per trial-rung); needs a Prefect server they reach (PREFECT_API_URL) and storage "
        "they share.", json_schema_extra={"mlflow": "param", "on_resume": "may change"})
    job_id: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9._-]+$", description="Name of the job's folder; default: time-stamped.",
        json_schema_extra={"metavar": "JOB", "on_resume": "may change"})
    tracking_uri: Optional[str] = Field(
        None, description="MLflow tracking URI; default MLFLOW_TRACKING_URI or sqlite:///mlflow.db (a local store's "
        "path made absolute); a resume: the store its job began in.",
        json_schema_extra={"metavar": "URL", "on_resume": "may change"})
    experiment: str = Field("hyperband", min_length=1, description="MLflow experiment; also the registered model's name.",
        json_schema_extra={"metavar": "NAME"})
    nest_under: Optional[str] = Field(
        None, description="MLflow run id to nest this job's parent run under (set by a scaling study).",
        json_schema_extra={"metavar": "RUN_ID"}
    )
    register_model: bool = Field(True, description="Register the best model with alias 'champion' when it beats the "
        "current champion (same metric, direction and validation data), else 'challenger'.",
        json_schema_extra={"on_resume": "may change"})
    force_champion: bool = Field(False, description="Move alias 'champion' to this job's model even when it does not "
        "beat the current champion.",
        json_schema_extra={"on_resume": "may change"})
    baseline: bool = Field(True, description="Also train the model's default config to R, for the summary.")
    resume: bool = Field(False, description="Continue the job job_id from its saved state and checkpoints.",
        json_schema_extra={"metavar": "JOB", "on_resume": "may change"})

    @field_validator("metric", mode="before")
    @classmethod
    def _metrics(cls, value: Any) -> Any:
        """One metric as a plain string (a saved job, a Python call) is a list of one; each entry name[:max|min]."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)):
            names = [objectives.parse_entry(str(e))[0] for e in value]  # each entry checked
            if len(set(names)) < len(names):
                raise ValueError(f"metric names must differ, got {', '.join(names)}")
        return value or None

    @field_validator("job_id")
    @classmethod
    def _job_id(cls, value: str | None) -> str | None:
        """Found by a fuzz: ``..`` passed the pattern and made the job folder job_dir's parent (``.``: job_dir)."""
        if value in (".", ".."):
            raise ValueError(f"{value!r} is no folder of its own under --job-dir; name the job (letters, digits, "
                             "'.', '_', '-')")
        return value

    @field_validator("select")
    @classmethod
    def _select(cls, value: str) -> str:
        objectives.parse_select(value)
        return value

    @field_validator("dask_address")
    @classmethod
    def _address(cls, value: Optional[str]) -> Optional[str]:
        if value and "://" not in value:
            raise ValueError(f"dask_address must look like tcp://host:8786, got {value!r}")
        return value or None

    @model_validator(mode="after")
    def _resources(self) -> TuneParams:
        if self.min_resource > self.max_resource:
            raise ValueError(f"min_resource must be <= max_resource, got {self.min_resource} > {self.max_resource}")
        if self.resume and not self.job_id:
            raise ValueError("resume needs the job_id of the job to continue")
        if self.max_trials is not None and self.mode != "asha" and not self.resume:  # a saved job resumes as it began
            raise ValueError(f"max_trials ({self.max_trials}) is ASHA's; Hyperband's brackets set their own configs: "
                             "add mode asha, or drop max_trials")
        if self.target_resource is not None and self.target_resource > self.max_resource:
            raise ValueError(f"target_resource must be <= max_resource, got {self.target_resource} > {self.max_resource}")
        given = {f: m for f, m in registry.user_code_fields().items() if getattr(self, f, None)}
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} together: give one, a function (--trainer) or a script (--script)")
        for model in given.values():
            self.model = model
        if self.external_memory:
            _check_external_memory(self)
        if self.task_workers:
            _check_task_workers(self)
        code = registry.get(self.model).user_code
        if code == "trainer" and self.dask_address and self.workers != 1:
            raise ValueError(f"a training function runs each trial-rung on one Dask worker; drop workers "
                             f"({self.workers}), or give a DDP script (--script) to run ranks on several")
        if code:
            directed = bool(self.metric) and objectives.parse_entry(self.metric[0])[1] is not None  # loss:min
            missing = [f for f in (code, "metric", "direction", "space") if not getattr(self, f)
                       and not (f == "direction" and directed)]
            if missing:
                example = "--trainer my.py:train" if code == "trainer" else "--script train.py"
                raise ValueError(f"your own {code} needs {', '.join(missing)} (e.g. {example} "
                                 "--metric val_loss --direction minimize --space space.yaml)")
        if self.metric and len(self.metric) > 1:
            objectives.check_several(self.metric, bool(code))
        elif self.select != "first" and not self.resume:  # a job saved with it resumes as it began
            raise ValueError(f"select {self.select!r} picks the champion among several objectives; give two or more "
                             "metric entries (e.g. --metric val_auc --metric predict_ms:min), or drop select")
        return self

    def trial_concurrency(self, cluster_workers: int | None = None) -> int:
        """Trials at once: given; on a Dask cluster of ``cluster_workers``, one per disjoint group of ``workers``;
        else as many as the cores hold at ``workers`` each."""
        if self.concurrency:
            return self.concurrency
        if cluster_workers:
            return max(1, cluster_workers // self.workers)
        if self.workers > 1 or self.external_memory:
            return 1  # the local cluster of one trial, or a table streamed from disk, already occupies the cores
        return max(1, (os.cpu_count() or 1))


def _check_task_workers(params: TuneParams) -> None:
    """``task_workers``: one place for trial-rungs at a time, and a Prefect server the workers can reach."""
    if params.trial_pool:
        raise ValueError(f"task_workers and trial_pool {params.trial_pool} together: give one (task workers are "
                         "warm processes; a work pool starts a flow run per trial-rung)")
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ValueError("task_workers needs a Prefect server that hyperband workers reach: set PREFECT_API_URL (a "
                         "job's temporary server is its process's alone), and start `hyperband worker` with the same")


def _check_external_memory(params: TuneParams) -> None:
    """``external_memory``: XGBoost's, on this machine, for a table read in parts."""
    from prefect_hyperband.trainers import data, tables

    if "external_memory" not in registry.get(params.model).fields:
        raise ValueError(f"external_memory is the xgboost model's; drop it for model {params.model}")
    if params.workers > 1 or params.dask_address:
        raise ValueError("external_memory trains on this machine without Dask; drop it, or drop workers and "
                         "dask_address (on Dask, each group's workers hold their share of the table in memory)")
    if params.data in data.BUILTIN or not tables.in_parts(params.data):
        raise ValueError(f"external_memory trains a table read in parts (a Parquet file, or a folder or glob of CSV "
                         f"or Parquet files, local or a URL); {params.data} is read whole, in memory")


def flat(params: TuneParams) -> dict[str, Any]:
    """The flow's keyword arguments for ``params``: the fields it was given (a resume tells them from defaults)."""
    return {name: getattr(params, name) for name in params.model_fields_set}
