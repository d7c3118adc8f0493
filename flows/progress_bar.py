"""The job's progress artifact in the Prefect UI, moved without the job's loop waiting for the Prefect API."""

from __future__ import annotations

import contextvars
import threading

from prefect_hyperband.tasks import report


class ProgressBar:
    """One job's progress artifact, moved by the job's loop (best effort: a failed update warns). ``id`` None: the
    artifact could not be created, and nothing moves.

    ``advance`` only counts: a thread of its own sends the latest count, one update at a time, so the bar never
    moves back and the loop never waits for the API. Sent from the loop, an update took 403 ms mean and up to 2 s at
    256 slots, when a wave's 256 trial-rungs' task runs kept the Prefect server busy; no slot took a trial-rung
    meanwhile."""

    def __init__(self, artifact_id: str | None, total: int) -> None:
        self.id, self.total, self.done = artifact_id, total, 0
        self._changed = threading.Condition()
        self._shown: tuple[int, int] | None = None  # the count the artifact shows (its last update's)
        self._sender: threading.Thread | None = None
        self._ended = False

    def advance(self, n: int = 1) -> float | None:
        """``n`` more finished trial-rungs; the percent the bar moves to (None without an artifact)."""
        if self.id is None:
            return None
        with self._changed:
            self.done += n
            self.total = max(self.total, self.done)  # ASHA or a resumed job may do more than planned
            if self._sender is None and not self._ended:  # in the caller's context: the job's run, its API
                self._sender = threading.Thread(target=contextvars.copy_context().run, args=(self._send_latest,),
                                                daemon=True, name="hyperband-progress")
                self._sender.start()
            self._changed.notify_all()
            return report.percent(self.done, self.total)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the artifact shows the latest count; False when ``timeout`` passed first."""
        with self._changed:
            return self._sender is None or self._changed.wait_for(lambda: self._shown == (self.done, self.total)
                                                                  or self._ended, timeout)

    def finish(self) -> None:
        """The bar to 100% at the end of the job, whatever was counted: the sender's update in flight first."""
        if self.id is None:
            return
        with self._changed:
            self.done = self.total = max(self.done, self.total)
            self._ended = True
            self._changed.notify_all()
            sender = self._sender
        if sender is not None:
            sender.join()
        self._send(self.done, self.total)

    def _send_latest(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._ended or self._shown != (self.done, self.total))
                if self._ended:
                    return
                latest = (self.done, self.total)
            self._send(*latest)
            with self._changed:
                self._shown = latest
                self._changed.notify_all()

    def _send(self, done: int, total: int) -> None:
        try:
            report.update_progress(self.id, done, total)  # type: ignore[arg-type]  (checked by the callers)
        except Exception as exc:
            report.warn_failure("progress update", exc)
