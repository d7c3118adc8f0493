"""The job's best model in MLflow: logged in its flavour on its trial's run, registered, aliased ``champion`` when
it beats the current champion, else ``challenger`` (``decide``).

The rule: a version is registered with its standing in its tags (``Standing``: its score, the metric, the direction
and the validation data's digest). It takes ``@champion`` when there is none yet, when it beats the current
champion's score (strictly) on the same metric, direction and validation data, when the job forces it
(``force_champion``), or when the two are not comparable: the current champion was scored on another metric or
direction, on other validation data (another data set, ``--seed`` or ``--validation-fraction``), or has no score
tags (registered by an older release). Otherwise it takes ``@challenger`` and ``@champion`` stays. The summary's
line says which, and why.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prefect_hyperband.tracking.flavours import log_flavoured
from prefect_hyperband.tracking.store import client
from prefect_hyperband.trainers.base import Flavoured

#: the registered model's alias for the best version (``decide``)
CHAMPION = "champion"
#: the alias of the newest job's version when it did not beat the champion
CHALLENGER = "challenger"
#: a registered version's tags that keep its standing (``Standing``)
SCORE, METRIC, DIRECTION, DIGEST = "hyperband.score", "hyperband.metric", "hyperband.direction", "hyperband.data_digest"


@dataclass(frozen=True)
class Standing:
    """What a version is ranked by: its ``score`` on ``metric`` (better ``direction``: max or min) on the validation
    data whose digest is ``digest`` ("" for a job without a dataset of its own: then metric and direction alone)."""

    score: float
    metric: str
    direction: str
    digest: str = ""

    def tags(self) -> dict[str, str]:
        """The version's tags that keep it."""
        tags = {SCORE: repr(self.score), METRIC: self.metric, DIRECTION: self.direction}
        return {**tags, DIGEST: self.digest} if self.digest else tags

    @classmethod
    def of(cls, tags: Mapping[str, str]) -> Standing | None:
        """A version's standing from its tags; None when it has none (an older release registered it)."""
        try:
            score = float(tags[SCORE])
            return cls(score, tags[METRIC], tags[DIRECTION], tags.get(DIGEST, "")) if math.isfinite(score) else None
        except (KeyError, ValueError):
            return None

    def shown(self) -> str:
        """The score as the summary's line gives it (``val_auc 0.8053``)."""
        return f"{self.metric} {self.score:.6g}"


@dataclass(frozen=True)
class Registered:
    """A job's registered version, the alias it took (``champion`` or ``challenger``) and the summary's line why."""

    version: int
    alias: str
    line: str


def decide(new: Standing | None, version: int, current: Standing | None, current_version: int | None,
           force: bool = False) -> tuple[str, str]:
    """(the alias ``version`` takes, the line saying why): ``champion`` unless the current champion's score, on the
    same metric, direction and data, is as good or better (then ``challenger``); forced, or not comparable: champion."""
    mine = f"version {version}" + (f" ({new.shown()})" if new is not None else "")
    if current_version is None or current_version == version:  # the first, or this version again (a retry)
        return CHAMPION, f"champion: {mine}"
    theirs = f"version {current_version}" + (f" ({current.shown()})" if current is not None else "")
    if force:
        return CHAMPION, f"champion moved (forced): this job's {mine} replaces {theirs}"
    other = incomparable(new, current, current_version)
    if other:
        return CHAMPION, f"champion moved: {other}; this job's {mine} is @{CHAMPION}"
    assert new is not None and current is not None
    if new.score > current.score if new.direction == "max" else new.score < current.score:
        return CHAMPION, f"champion moved: this job's {mine} beats {theirs}"
    return CHALLENGER, f"champion kept: {theirs}; this job's {mine} is @{CHALLENGER}"


def incomparable(new: Standing | None, current: Standing | None, current_version: int) -> str:
    """Why the current champion's score cannot be compared with the new one's ("" when it can)."""
    theirs = f"version {current_version}"
    if new is None:
        return "this job's model has no score to compare"
    if current is None:
        return f"{theirs} has no score tags (registered by an older release)"
    if (current.metric, current.direction) != (new.metric, new.direction):
        return (f"{theirs} was scored on another metric ({current.metric}, {current.direction}; this job's "
                f"{new.metric}, {new.direction})")
    if current.digest != new.digest:
        return (f"{theirs} ({current.shown()}) was scored on other data (validation digest "
                f"{current.digest or 'none'}; this job's {new.digest or 'none'})")
    return ""


def log_champion(uri: str, run_id: str, model: Any, trainer: Callable[[], Any], checkpoint: str, name: str,
                 metrics: Mapping[str, float] | None = None, validation: Callable[[], Any] | None = None,
                 parent_run_id: str | None = None, step: int = 0, job_id: str = "", direction: str = "max",
                 force: bool = False) -> Registered | None:
    """Log the best trial's model in its flavour on its run (the plug-in's ``log_model`` with ``trainer()``, built
    only then: it may load the data), link ``metrics`` to it
    (for the dataset ``validation()`` gives, also built only then: its digest reads every row; the run's own
    points at ``step``, the resource they were measured at, so its
    history gains no point), list it among the parent run's outputs, register it as ``name`` with its standing
    (``metrics``' first, better ``direction``, the validation digest) and alias it ``champion`` or ``challenger``
    (``decide``; ``force``: champion); None when the plug-in had nothing to log. MLflow's own lines go to its
    logger, not the terminal.

    Once per job, run and ``step``: the version is registered with the tags ``hyperband.job_id`` and
    ``hyperband.resource``, and a version that has them already (MLflow went away after registering it, and the
    write is tried again, or ``--resume`` writes the job's end again) is aliased again, not registered twice. The
    logged model carries the same tags: one logged before a cut is registered, not logged again."""
    import mlflow
    from mlflow.entities import LoggedModelOutput

    c = client(uri)
    found = registered(c, name, run_id, job_id, step)
    if found is not None:
        return _aliased(c, name, found, _found_standing(c, name, found, metrics, validation, direction), force)
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
    data = validation() if validation is not None else None
    if model_id:
        linked = {"dataset_name": data.name, "dataset_digest": data.digest} if data is not None else {}
        for key, value in (metrics or {}).items():
            # the run's point at this step, as logged (same key, step, value and time: MLflow keeps one row)
            same = [m for m in c.get_metric_history(run_id, key) if m.step == step]
            point = same[-1] if same else None
            c.log_metric(run_id, key, point.value if point else float(value), step=step, model_id=model_id,
                         timestamp=point.timestamp if point else None, **linked)
        if parent_run_id and model_id not in _outputs(c, parent_run_id):  # MLflow refuses the same output twice
            c.log_outputs(parent_run_id, [LoggedModelOutput(model_id, 0)])
    standing = standing_of(metrics, direction, data)
    with _to_logger():
        tags = {**_tags(job_id, step), **(standing.tags() if standing is not None else {})}
        version = int(mlflow.register_model(model_uri, name, tags=tags).version)
    return _aliased(c, name, version, standing, force)


def standing_of(metrics: Mapping[str, float] | None, direction: str, data: Any = None) -> Standing | None:
    """A new version's standing: ``metrics``' first (the job's metric), on ``data``'s digest; None without a score."""
    key, value = next(iter((metrics or {}).items()), (None, None))
    if key is None or value is None or not math.isfinite(float(value)):
        return None
    return Standing(float(value), key, direction, str(getattr(data, "digest", "") or ""))


def _found_standing(c: Any, name: str, version: int, metrics: Mapping[str, float] | None,
                    validation: Callable[[], Any] | None, direction: str) -> Standing | None:
    """The standing of a version this job registered before: from its tags, else made now and tagged."""
    kept = Standing.of(c.get_model_version(name, str(version)).tags or {})
    if kept is not None:
        return kept
    standing = standing_of(metrics, direction, validation() if validation is not None else None)
    for key, value in (standing.tags() if standing is not None else {}).items():
        c.set_model_version_tag(name, str(version), key, value)
    return standing


def _aliased(c: Any, name: str, version: int, standing: Standing | None, force: bool) -> Registered:
    """``version`` given the alias ``decide`` gives it against the current champion (read from its tags)."""
    aliases = dict(c.get_registered_model(name).aliases or {})
    held = aliases.get(CHAMPION)
    current = None
    if held is not None and int(held) != version:
        current = Standing.of(c.get_model_version(name, str(held)).tags or {})
    alias, line = decide(standing, version, current, None if held is None else int(held), force)
    c.set_registered_model_alias(name, alias, str(version))
    if alias == CHAMPION and str(aliases.get(CHALLENGER)) == str(version):  # a challenger before, forced now
        c.delete_registered_model_alias(name, CHALLENGER)
    return Registered(version, alias, line)


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


#: a line MLflow's logging handler formatted (``2026/12/06 02:00:00 INFO mlflow.store.db.utils: ...``)
_LOGGED = re.compile(r"\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} [A-Z]+ [\w.]+: ")


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
            if _LOGGED.match(text):  # MLflow's handler's own line (it writes to sys.stderr as it is now): one prefix
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
