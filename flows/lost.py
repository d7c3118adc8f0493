"""What a lost controller leaves behind (its process or machine killed: SIGKILL, a power cut), ended by the resume.

A job killed that way ends nothing itself: its flow run (with its groups' subflow runs and the task runs in flight)
stays ``Running`` in Prefect, and MLflow keeps the runs it had open. ``--resume`` takes over the job's lock, which
names the dead process's flow run: that flow run and what ran under it end ``Crashed``, naming the flow run that
took over. MLflow's parent run and the runs of trials still in flight are the resume's own again (it goes on with
them); a child run the dead process created for a trial the resumed job never trains ends ``KILLED`` at the end.
"""

from __future__ import annotations

from typing import Any

from prefect_hyperband.common.errors import unavailable
from prefect_hyperband.tracking import runs as tracking

#: the states a lost process leaves its runs in
_OPEN = ["PENDING", "RUNNING", "SCHEDULED", "CANCELLING", "PAUSED"]
#: at most this many task runs are ended (the API's page; a job's slots are in flight, the rest finished)
_TASK_RUNS = 200


def end_lost_flow_run(lost: dict[str, Any], by: str, logger) -> int:
    """The dead holder's flow run, its subflow runs and their open task runs end ``Crashed``; how many ended. An API
    that does not know them (another Prefect server, a temporary one) or fails: one warning line, the job goes on."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterParentFlowRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.states import Crashed

    old = lost["flow_run_id"]
    message = (f"the job's process was lost (host {lost.get('host')}, pid {lost.get('pid')}); "
               f"its job goes on in flow run {by}")
    ended = 0
    try:
        with get_client(sync_client=True) as client:
            open_state = FlowRunFilterState(type=FlowRunFilterStateType(any_=_OPEN))
            flow_runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[old]),
                                                                            state=open_state))
            if not flow_runs:
                return 0
            flow_runs += client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[old]), state=open_state))
            ids = [fr.id for fr in flow_runs]
            task_runs = client.read_task_runs(limit=_TASK_RUNS, task_run_filter=TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=ids),
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=_OPEN))))
            for tr in task_runs:
                client.set_task_run_state(tr.id, Crashed(message=message), force=True)
            for fr in reversed(flow_runs):  # the groups first, the job's flow run last
                client.set_flow_run_state(fr.id, Crashed(message=message), force=True)
            ended = len(flow_runs)
    except Exception as exc:  # noqa: BLE001  (the job's results do not depend on the old run's state)
        logger.warning("could not end the lost flow run %s: %s: %s", old, type(exc).__name__, exc)
        return 0
    logger.warning("the job's previous process (host %s, pid %s) was lost; its flow run %s and %d under it ended "
                   "Crashed", lost.get("host"), lost.get("pid"), old, ended - 1)
    return ended


def end_orphan_runs(job: Any, records: list, runs: dict[str, str], logger) -> list[str]:
    """Child runs of trials this job does not hold (created by a process killed before it saved them, and not
    sampled again): ended ``KILLED`` with ``hyperband.status`` ``abandoned``; their run ids."""
    known = {t.trial_id for t in records}
    orphans = [run_id for trial_id, run_id in runs.items() if trial_id not in known]
    for run_id in orphans:
        try:
            tracking.set_tags(job.tracking_uri, run_id, {"hyperband.status": "abandoned"})
            tracking.end_run(job.tracking_uri, run_id, "KILLED")
        except Exception as exc:  # noqa: BLE001  (the job's results stand)
            if unavailable(exc):  # each run would wait the client's whole bound again: the job stops (flows.ending)
                raise
            logger.warning("MLflow: could not end run %s: %s", run_id, exc)
    if orphans:
        logger.info("%d child runs of trials the job never trained (their process was lost) ended KILLED", len(orphans))
    return orphans
