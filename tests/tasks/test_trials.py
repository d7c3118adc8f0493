"""The train step's repair of a damaged checkpoint: rebuilt with the calls that first wrote it (no Prefect here:
``rebuild`` is plain code over a trainer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prefect_hyperband.executors.job import Job
from prefect_hyperband.tasks.trials import rebuild
from prefect_hyperband.trainers.base import TrainResult, write_sidecar
from prefect_hyperband.trainers.data import DataSpec
from prefect_hyperband.trainers.factory import TrainerSettings


@dataclass
class Recorder:
    """A trainer whose checkpoint is the list of calls that built it: equal bytes mean the same calls."""

    calls: list[tuple[int, str | None]] = field(default_factory=list)

    def train(self, config, resource, checkpoint, out):
        held = Path(checkpoint).read_text() if checkpoint else ""
        start = int(held.rsplit(">", 1)[-1]) if held else 0
        self.calls.append((resource, None if checkpoint is None else Path(checkpoint).name))
        Path(out).write_text(f"{held}>{resource}")
        write_sidecar(out, resource)
        return TrainResult(out, resource, resource - start, 1.0, 1)


def job(tmp_path: Path) -> Job:
    return Job(job_id="j", job_dir=str(tmp_path), settings=TrainerSettings(model="xgboost", data=DataSpec(),
                                                                          milestones=(1, 3, 9, 27)),
               metric="auc", direction="max", min_resource=1, max_resource=27, eta=3, seed=0, space={},
               default_config={}, tracking_uri="sqlite:///unused.db", experiment="e", concurrency=1)


def test_a_damaged_checkpoint_is_rebuilt_from_the_newest_whole_one_below_with_the_same_calls(tmp_path):
    j, trainer = job(tmp_path), Recorder()
    checkpoint = None
    for r in (3, 9, 27):  # a trial of the bracket that begins at r=3
        checkpoint = trainer.train({}, r, checkpoint, j.checkpoint_path("t", r)).checkpoint
    whole = {r: Path(j.checkpoint_path("t", r)).read_text() for r in (3, 9, 27)}
    Path(j.checkpoint_path("t", 9)).write_text("")  # emptied
    Path(j.checkpoint_path("t", 27)).write_text(whole[27][:3])  # cut short
    trainer.calls.clear()

    rebuilt = rebuild(j, trainer, "t", {}, 27)
    assert trainer.calls == [(9, "r3.ubj"), (27, "r9.ubj")]  # from r=3, one rung at a time
    assert {r: Path(j.checkpoint_path("t", r)).read_text() for r in (3, 9, 27)} == whole
    assert (rebuilt.resource_trained, rebuilt.seconds, rebuilt.info["rebuilt_from"]) == (24, 2.0, "r=3")


def test_with_no_whole_checkpoint_below_the_trial_is_rebuilt_from_scratch_where_it_began(tmp_path):
    j, trainer = job(tmp_path), Recorder()
    trainer.train({}, 3, None, j.checkpoint_path("t", 3))
    Path(j.checkpoint_path("t", 3)).write_text("")
    trainer.calls.clear()
    rebuilt = rebuild(j, trainer, "t", {}, 3)
    assert trainer.calls == [(3, None)] and "rebuilt_from" not in rebuilt.info
