"""The job's best model in MLflow: logged in its flavour on its trial's run, registered, aliased ``champion``."""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import threading
from typing import Any, Callable, Iterator, Mapping

from prefect_hyperband.tasks.flavours import log_flavoured
from prefect_hyperband.tasks.mlflow_store import client
from prefect_hyperband.trainers.base import Flavoured

#: the registered model's alias for the best model of the newest job
CHAMPION = "champion"


def log_champion(uri: str, run_id: str, model: Any, trainer: Callable[[], Any], checkpoint: str, name: str,
                 metrics: Mapping[str, float] | None = None, validation: Callable[[], Any] | None = None,
                 parent_run_id: str | None = None, step: int = 0, job_id: str = "") -> int | None:
    """Log the best trial's model in its flavour on its run (the plug-in's ``log_model`` with ``trainer()``, built
    only then: it may load the data), link ``metrics`` to it
    (for the dataset ``validation()`` gives, also built only then: its digest reads every row; the run's own
    points at ``step``, the resource they were measured at, so its
    history gains no point), list it among the parent run's outputs, register it as ``name`` and alias it
    ``champion``; None when the plug-in had nothing to log. MLflow's own lines go to its logger, not the terminal.

    Once per job, run and ``step``: the version is registered with the tags ``hyperband.job_id`` and
    ``hyperband.resource``, and a version that has them already (MLflow went away after registering it, and the
    write is tried again, or ``--resume`` writes the job's end again) is aliased again, not registered twice. The
    logged model carries the same tags: one logged before a cut is registered, not logged again."""
    import mlflow
    from mlflow.entities import LoggedModelOutput

    c = client(uri)
    found = registered(c, name, run_id, job_id, step)
    if found is not None:
        c.set_registered_model_alias(name, CHAMPION, str(found))
        return found
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    model_uri, model_id = logged(c, run_id, job_id, step)  # logged before MLflow went away: not logged again
    if model_uri is None:
        tagged = "tags" in inspect.signature(model.log_model).parameters  # born with them: no window for a cut
        with mlflow.start_run(run_id=run_id), _to_logger():
            info = model.log_model(trainer(), checkpoint, **({"tags": _tags(job_id, step)} if tagged else {}))
            if isinstance(info, Flavoured):  # a built-in's model, described by its plug-in: logged here, born tagged
                info, tagged = log_flavoured(info, _tags(job_id, step)), True
        if info is None:
            return None
        model_uri, model_id = info.model_uri, getattr(info, "model_id", None)
        if model_id and not (tagged and _tags(job_id, step).items() <= c.get_logged_model(model_id).tags.items()):
            c.set_logged_model_tags(model_id, _tags(job_id, step))  # a plug-in (or a user's hook) that did not pass them
    if model_id:
        data = validation() if validation is not None else None
        linked = {"dataset_name": data.name, "dataset_digest": data.digest} if data is not None else {}
        for key, value in (metrics or {}).items():
            # the run's point at this step, as logged (same key, step, value and time: MLflow keeps one row)
            same = [m for m in c.get_metric_history(run_id, key) if m.step == step]
            point = same[-1] if same else None
            c.log_metric(run_id, key, point.value if point else float(value), step=step, model_id=model_id,
                         timestamp=point.timestamp if point else None, **linked)
        if parent_run_id and model_id not in _outputs(c, parent_run_id):  # MLflow refuses the same output twice
            c.log_outputs(parent_run_id, [LoggedModelOutput(model_id, 0)])
    with _to_logger():
        version = int(mlflow.register_model(model_uri, name, tags=_tags(job_id, step)).version)
    c.set_registered_model_alias(name, CHAMPION, str(version))
    return version


def _outputs(c: Any, run_id: str) -> set[str]:
    outputs = c.get_run(run_id).outputs
    return {o.model_id for o in (outputs.model_outputs if outputs else [])}


def _tags(job_id: str, step: int) -> dict[str, str]:
    return {"hyperband.job_id": job_id, "hyperband.resource": str(step)}


def logged(c: Any, run_id: str, job_id: str, step: int) -> tuple[str | None, str | None]:
    """The URI and id of the model this job logged in its flavour on ``run_id`` for ``step`` (whole: READY)."""
    from mlflow.exceptions import MlflowException

    try:
        experiment = c.get_run(run_id).info.experiment_id
        models = c.search_logged_models([experiment], filter_string=" AND ".join(
            f"tags.`{k}` = '{v}'" for k, v in _tags(job_id, step).items()))
    except MlflowException:  # a store that cannot search logged models: logged again
        return None, None
    for m in models:
        if m.source_run_id == run_id and str(getattr(m.status, "name", m.status)).endswith("READY"):
            return m.model_uri, m.model_id
    return None, None


def registered(c: Any, name: str, run_id: str, job_id: str, step: int) -> int | None:
    """The version of ``name`` this job registered from ``run_id``'s model at ``step``, if there is one."""
    from mlflow.exceptions import MlflowException

    try:
        versions = c.search_model_versions(f"run_id = '{run_id}'")
    except MlflowException:  # a store that cannot search versions by run: registered again
        return None
    mine = [int(v.version) for v in versions
            if v.name == name and all((v.tags or {}).get(k) == w for k, w in _tags(job_id, step).items())]
    return max(mine) if mine else None


@contextlib.contextmanager
def _to_logger() -> Iterator[None]:
    """MLflow's prints to stderr ("Successfully registered model ...") as INFO lines of its ``mlflow`` logger, which
    the CLI keeps in the job's log file (and shows with ``--verbose``). Only this thread's prints are moved."""
    original = sys.stderr
    logger = logging.getLogger("mlflow")
    me = threading.get_ident()

    class Lines:
        inside = False  # MLflow's own handler writes to whatever sys.stderr is: that write goes to the terminal

        def write(self, text: str) -> int:
            if threading.get_ident() != me or self.inside:
                return original.write(text)
            self.inside = True
            try:
                for line in text.splitlines():
                    if line.strip():
                        logger.info(line.strip())
            finally:
                self.inside = False
            return len(text)

        def flush(self) -> None:
            original.flush()

        def __getattr__(self, name: str) -> Any:
            return getattr(original, name)

    sys.stderr = Lines()  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stderr = original
