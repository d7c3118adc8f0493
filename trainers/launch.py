"""The processes of a trial: torch's launcher and its ranks, stopped as a group, and why they failed, in a few lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from prefect_hyperband.trainers.exits import failed_ranks, lost_a_peer, summary_ranks

#: Seconds the launcher gets to stop its ranks after SIGTERM before everything is SIGKILLed.
TERMINATE_GRACE = 5.0
#: lines of a rank's stderr a failure message quotes
TAIL_LINES = 20
#: torch's launcher run as ``python -m torch.distributed.run`` runs it, then an exit that leaves its heap to the OS:
#: the interpreter's last garbage collection over torch's objects took 0.34 s of each launch here (a launcher of two
#: ranks that exit at once, six launches each way, alternating: median 1.82 s, now 1.48 s), paid by every cold
#: trial-rung
LAUNCHER = ("import gc, runpy\n"
            "try:\n"
            "    runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)\n"
            "finally:\n"
            "    gc.freeze()\n")


def torch_launcher() -> list[str]:
    """The command that starts torch's launcher (``torch.distributed.run``); its arguments follow."""
    return [sys.executable, "-c", LAUNCHER]


def contract(rank: int, world: int, local_rank: int, local_world: int, master: str, port: int) -> dict[str, str]:
    """torchrun's environment contract for one rank."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": master, "MASTER_PORT": str(port)}


def processes_with(marker: str) -> list[int]:
    """Pids (other than ours) whose command line contains ``marker``; Linux /proc only."""
    needle, pids = marker.encode(), []
    proc = Path("/proc")
    if not proc.is_dir():
        return pids
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _signal(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def terminate(proc: subprocess.Popen, marker: str) -> None:
    """Stop the launcher's process group (SIGTERM, then SIGKILL) and any rank left with ``marker``."""
    if proc.poll() is None:
        _signal(proc.pid, signal.SIGTERM, group=True)
        try:
            proc.wait(timeout=TERMINATE_GRACE)
        except subprocess.TimeoutExpired:
            _signal(proc.pid, signal.SIGKILL, group=True)
            proc.wait()
    # ranks run in sessions of their own (torch starts them with start_new_session=True)
    deadline = time.monotonic() + TERMINATE_GRACE
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.05)


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _causes_first(workdir: Path, launcher_log: str) -> tuple[list[int], str]:
    """The launcher's root cause, unless its ranks only lost a peer (gloo's "Connection closed by peer", then an
    abort) while another rank failed of itself (not stopped by the launcher's SIGTERM): a rank whose peer exits can
    die first, and the launcher names it. Then every failed rank, those of their own failure first, and their exit
    codes."""
    ranks, codes = root_cause(launcher_log)
    failed = failed_ranks(launcher_log)
    lost = {r for r, _ in failed if lost_a_peer(_tail(workdir / f"rank{r}.stderr"))}
    causes = [r for r, code in failed if r not in lost and code != -signal.SIGTERM]  # not stopped by the launcher
    if not causes or not set(ranks) <= lost:
        return ranks, codes
    printed = dict(summary_ranks(launcher_log))
    ordered = causes + sorted(lost)
    return ordered, "; ".join(printed.get(r, "?") for r in ordered)


def root_cause(launcher_log: str) -> tuple[list[int], str]:
    """Ranks named as the root cause in torch.distributed.run's failure report, and their exit codes as printed."""
    cause = summary_ranks(launcher_log.partition("Root Cause")[2])
    return sorted({r for r, _ in cause}), "; ".join(code for _, code in cause)


def failure_message(workdir: Path, headline: str) -> str:
    """``headline`` plus the stderr tail of the failed rank(s), else of every rank and the launcher. Ranks that failed
    of themselves come before those that only lost a peer (``_causes_first``)."""
    launcher = _tail(workdir / "launcher.log", 200)
    ranks, codes = _causes_first(workdir, launcher)
    files = [workdir / f"rank{r}.stderr" for r in ranks] or sorted(workdir.glob("rank*.stderr"))
    parts = [headline]
    if ranks:
        parts[0] += f" (failed rank{'s' if len(ranks) > 1 else ''}: {', '.join(map(str, ranks))}; exit code {codes})"
    for path in files:
        tail = _tail(path)
        if tail:
            parts.append(f"--- {path.stem} stderr ---\n{tail}")
    if len(parts) == 1 or not ranks:
        parts.append(f"--- launcher ---\n{_tail(workdir / 'launcher.log')}")
    return "\n".join(parts)
