"""A test-only TorchTrainer whose ranks fail on purpose: the fault a test asks for never passes through a config
a user could write. ``FaultyTorchTrainer.train(config, ..., fault=Fault(...))`` sends the fault in the job the
ranks read, and the ranks run this module, which wraps the product's worker (``python -m faulty_torch``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from prefect_hyperband.trainers.torch.ddp import TorchTrainer


@dataclass(frozen=True)
class Fault:
    rank: int
    #: "abort_at_exit": the rank aborts (SIGABRT) after its cold run's destroy_process_group(), its work done
    how: Literal["exit", "raise", "kill", "hang", "abort_at_exit"] = "exit"
    epoch: int = 1  # 1-based: the rank fails as this epoch starts


class _FewRows:
    """A ``TorchTrainer`` whose ranks train on the first ``max_train_rows`` training rows (a test's speed; the
    product has no such knob)."""

    def __init__(self, *args: Any, max_train_rows: int | None = None, **kwargs: Any) -> None:
        self.max_train_rows = max_train_rows  # before the trainer's own set-up, which may hand its arrays out
        super().__init__(*args, **kwargs)

    def arrays(self) -> dict[str, Any]:
        split = super().arrays()  # type: ignore[misc]
        rows = self.max_train_rows
        return {**split, "X_train": split["X_train"][:rows], "y_train": split["y_train"][:rows]}


class SmallTorchTrainer(_FewRows, TorchTrainer):
    """The product's ``TorchTrainer`` on fewer training rows."""


class FaultyTorchTrainer(_FewRows, TorchTrainer):
    worker_module = "faulty_torch"

    def train(self, config: Mapping[str, Any], resource: int, checkpoint: str | None, out: str,
              fault: Fault | None = None):
        self._fault = fault
        try:
            return super().train(config, resource, checkpoint, out)
        finally:
            self._fault = None

    def _job(self, *args: Any, **kwargs: Any) -> dict:
        job = super()._job(*args, **kwargs)
        if getattr(self, "_fault", None) is not None:
            job["fault"] = asdict(self._fault)
        return job

    def environment(self, gpus: tuple[int, ...] | None = None) -> dict[str, str]:
        env = super().environment(gpus)
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env["PYTHONPATH"]])
        return env


def _fail(how: str, rank: int, epoch: int) -> None:
    print(f"injected failure ({how}) at rank {rank}, epoch {epoch}", file=sys.stderr, flush=True)
    if how == "raise":
        raise RuntimeError(f"injected failure at rank {rank}, epoch {epoch}")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "hang":
        while True:
            time.sleep(1)
    os._exit(1)


def _main() -> None:
    from prefect_hyperband.trainers.torch import worker as torch_worker

    train_job, train_epoch = torch_worker.train_job, torch_worker.Run.train_epoch

    def faulty_train_job(job: Mapping[str, Any], rank: int, *args: Any, **kwargs: Any) -> None:
        fault = job.get("fault")
        if fault and fault["rank"] == rank and fault["how"] != "abort_at_exit":
            def failing_epoch(run: Any, epoch: int) -> float:
                if epoch + 1 == fault["epoch"]:
                    _fail(fault["how"], rank, epoch + 1)
                return train_epoch(run, epoch)

            torch_worker.Run.train_epoch = failing_epoch  # this rank's process ends with its failure
        train_job(job, rank, *args, **kwargs)

    def aborting_run(job: Mapping[str, Any], rank: int, *args: Any) -> None:
        run(job, rank, *args)
        fault = job.get("fault")
        if fault and fault["rank"] == rank and fault["how"] == "abort_at_exit":  # torch's race at exit, on purpose
            print("terminate called without an active exception", file=sys.stderr, flush=True)
            os.abort()

    run = torch_worker.run
    torch_worker.train_job, torch_worker.run = faulty_train_job, aborting_run
    torch_worker.main()


if __name__ == "__main__":
    _main()
