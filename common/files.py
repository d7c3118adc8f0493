"""Files a reader never sees half written, and a lock across processes of this machine."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | os.PathLike[str], payload: Mapping[str, Any], indent: int | None = 2) -> None:
    """Write JSON so that a reader never sees half a file (a killed job leaves the old or the new one).

    ``indent=None`` for files rewritten often: ``json.dumps`` then runs in C, ~10x faster than indented.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=indent, sort_keys=True, default=str)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing), across processes on this machine; released on
    exit, or by the kernel when the process dies."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
