"""A real two-rank script for the gloo race at exit (tests of ``trainers.script`` here and on Dask)."""

#: a real two-rank script (under torch's launcher, or its ranks on Dask workers); rank 1 aborts as gloo's race
#: does, after the work or before it
RACE_SCRIPT = """
import os, sys
from pathlib import Path

import pytest
import torch.distributed as dist
import prefect_hyperband as hb
dist.init_process_group("gloo")
rank, resource = dist.get_rank(), int(os.environ["HYPERBAND_RESOURCE"])
if sys.argv[-1] == "before" and rank == 1:
    sys.stderr.write("terminate called without an active exception\\n"); sys.stderr.flush(); os.abort()
pids = [0, 0]
dist.all_gather_object(pids, os.getpid())  # rank 1 waits below for rank 0's process to end
if rank == 0:
    for step in range(1, resource + 1):
        hb.report(step, loss=1.0 / step)
    (Path(os.environ["HYPERBAND_CHECKPOINT_DIR"]) / "state.pt").write_text("whole")
dist.barrier()
dist.destroy_process_group()
if rank == 1:  # once rank 0 has exited (a zombie until its launcher reaps it): a loaded machine takes seconds
    import time
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pids[0]}/stat").read_text().rsplit(") ", 1)[-1][:1] in "ZX":
                break
        except OSError:
            break
        time.sleep(0.05)
    sys.stderr.write("terminate called without an active exception\\n"); sys.stderr.flush(); os.abort()
"""
