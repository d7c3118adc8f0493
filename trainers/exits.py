"""Whether a trial-rung whose ranks exited non-zero after their work keeps its result (torch's abort at exit).

torch's gloo (and NCCL) can abort a rank with SIGABRT while Python shuts down, after the script's work is done
("terminate called without an active exception", pytorch/pytorch#179291); the launcher then stops the other
ranks with SIGTERM. Rank 0 itself may be the one aborted. What decides is not the exit codes but what the
ranks left: rank 0's report of the rung's last unit (``HYPERBAND_RESOURCE``) and a complete checkpoint. A
checkpoint is complete when

- every ``torch.distributed.checkpoint`` (DCP) folder in it holds its ``.metadata`` (the coordinator writes it
  once every rank's part is written) and a part (``__<rank>_<n>.distcp``) of every rank;
- every ``torch.save`` file in it (a zip archive) is whole: its central directory, written last, is there;
- it holds at least one file.

A rank that aborts before rank 0's last report, or a checkpoint short of a part, is still the trial's failure.
"""

from __future__ import annotations

import re
import signal
import zipfile
from pathlib import Path

#: a failed rank in torch's launcher summary: ``rank : 1 (local_rank: 1)`` then ``exitcode : -6 (pid: ...)``
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*([^\n]*)", re.M)
#: what a rank's error says when it failed only because a peer rank went away (gloo's transport)
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "gloo/transport")
#: a DCP part: ``__<rank>_<n>.distcp``
_DCP_PART = re.compile(r"^__(\d+)_\d+\.distcp$")
_ZIP_MAGIC = b"PK\x03\x04"


def summary_ranks(section: str) -> list[tuple[int, str]]:
    """``(rank, exit code as printed)`` of each failed rank a part of torch's launcher summary lists, in its order:
    ``(1, "-6 (pid: 4242)")``."""
    return [(int(r), " ".join(c.split())) for r, c in _SUMMARY_RANK.findall(section)]


def failed_ranks(launcher_output: str) -> list[tuple[int, int]]:
    """``(rank, exit code)`` of every rank torch's launcher listed as failed, the root cause first."""
    failures, _, root = launcher_output.partition("Root Cause")
    listed = summary_ranks(root) + summary_ranks(failures)
    pairs = [(r, int(m.group())) for r, text in listed if (m := re.match(r"-?\d+", text))]
    return list(dict.fromkeys(pairs))


def lost_a_peer(stderr: str) -> bool:
    """Whether a failed rank's stderr says it failed only because a peer rank went away (``PEER_LOST``)."""
    return any(words in stderr for words in PEER_LOST)


def checkpoint_complete(directory: Path, world_size: int) -> str | None:
    """What makes the checkpoint in ``directory`` complete (a short phrase), or None when it is not."""
    files = [p for p in sorted(directory.rglob("*")) if p.is_file()] if directory.is_dir() else []
    if not files:
        return None
    folders = {p.parent for p in files if p.name == ".metadata" or _DCP_PART.match(p.name)}
    for folder in folders:
        if not (folder / ".metadata").is_file():
            return None
        ranks = {int(m.group(1)) for p in folder.iterdir() if (m := _DCP_PART.match(p.name))}
        if not set(range(world_size)) <= ranks:
            return None
    for path in files:
        if path.parent in folders or not _is_zip(path):
            continue
        try:
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
        except (zipfile.BadZipFile, OSError, EOFError):
            return None  # torn: its writer died mid-write
    if folders:
        return f"its DCP checkpoint has .metadata and a part from each of {world_size} rank(s)"
    return f"its checkpoint's {len(files)} file(s) are whole"


def _is_zip(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == _ZIP_MAGIC
    except OSError:
        return False


def why_kept(rank: int, code: int, step: int, complete: str) -> str:
    """The sentence the trial's log line and MLflow run carry for a result kept despite a rank's exit."""
    return (f"rank {rank} exited with code {code} ({_signal_name(code)}) after rank 0 reported r={step} and "
            f"{complete}: the result is kept")


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return "its own exit"
