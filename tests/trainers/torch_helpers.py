"""Helpers shared by the torch trainer tests (weights compared, processes left behind)."""

from __future__ import annotations

from pathlib import Path

import torch


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def torch_descendants(pid: int, besides: dict[int, str] | None = None) -> list[str]:
    """Command lines of live (non-zombie) descendants of ``pid`` that run torch code, from /proc, leaving out those
    in ``besides`` (``torch_processes``' answer before a test: what an earlier test of this worker left running)."""
    return [cmd for child, cmd in torch_processes(pid).items() if child not in (besides or {})]


def torch_processes(pid: int) -> dict[int, str]:
    """Live (non-zombie) descendants of ``pid`` that run torch code: their command lines by pid, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent:
                frontier.append(child)
                try:
                    cmd = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "torch" in cmd:
                    found[child] = cmd
    return found
