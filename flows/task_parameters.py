"""Where a background trial-rung's parameters travel: Prefect's result storage for ``trial_rung``
(``flows.task_workers.served``), in the job's ``--storage`` where one is given."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

from prefect_hyperband.executors.storage import is_local, join


def parameter_storage(root: str | None) -> Any:
    """Where background task runs' parameters travel (Prefect's result storage for ``trial_rung``):
    ``<root>/task-parameters`` (a local or shared folder, or any fsspec URL); None for Prefect's default. On an
    object store a ``RemoteFileSystem`` block saved on the Prefect server (``hyperband-parameters-<digest>``, once
    per process): Prefect takes only a saved block as a background task's result storage."""
    if not root:
        return None
    if is_local(root):
        return Path(root.removeprefix("file://")).resolve() / "task-parameters"
    url = join(root, "task-parameters")
    with _SAVING:
        if url not in _SAVED:
            from prefect.filesystems import RemoteFileSystem

            block = RemoteFileSystem(basepath=url)
            block.save(f"hyperband-parameters-{hashlib.sha256(url.encode()).hexdigest()[:12]}", overwrite=True)
            _SAVED[url] = block
        return _SAVED[url]


#: the parameter storage blocks this process saved, by URL (``parameter_storage``)
_SAVED: dict[str, Any] = {}
_SAVING = threading.Lock()
