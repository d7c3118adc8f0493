"""The user's DDP script on a Dask cluster: each rank a process on a worker of the group, the checkpoint directory
and rank 0's reports carried through Dask, the numbers of torch's launcher on one machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dask_cluster import cluster  # tests/dask_cluster.py
from prefect_hyperband.trainers.script import ScriptFailed, ScriptTrainer

ROOT = Path(__file__).resolve().parents[2]
DDP = str(ROOT / "examples" / "ddp_digits.py")
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.3"]  # two groups of two, each across two hosts
CONFIG = {"lr": 0.05, "hidden": 32, "batch_size": 32, "momentum": 0.9}


def state(result) -> dict[str, torch.Tensor]:
    return torch.load(Path(result.checkpoint).with_suffix("") / "state.pt", weights_only=True)["model"]


@pytest.mark.slow  # real scheduler, workers and script processes
def test_the_ddp_script_on_two_hosts_resumes_on_another_group_as_torchrun_trains_it_here(tmp_path):
    with cluster(HOSTS, str(tmp_path)) as c:
        remote = ScriptTrainer(DDP, "val_accuracy", workers=2, threads=2, timeout=120, dask_address=c.address)
        try:
            first = remote.train(CONFIG, 1, None, str(tmp_path / "t0" / "r1.json"))
            resumed = remote.train(CONFIG, 3, first.checkpoint, str(tmp_path / "t0" / "r3.json"))
            broken = tmp_path / "broken.py"
            broken.write_text("import os, sys\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
                              "sys.exit(4)\n")
            failing = ScriptTrainer(str(broken), "loss", workers=2, timeout=60, dask_address=c.address)
            try:
                with pytest.raises(ScriptFailed, match=r"(?s)rank \d .*exited with code 4.*rank \d of 2"):
                    failing.train({}, 1, None, str(tmp_path / "t1" / "r1.json"))
            finally:
                failing.close()
        finally:
            remote.close()
    local = ScriptTrainer(DDP, "val_accuracy", workers=2, threads=2, timeout=120)
    whole = local.train(CONFIG, 3, None, str(tmp_path / "t2" / "r3.json"))
    assert [h["step"] for h in resumed.history] == [2, 3] and resumed.resource_trained == 2
    assert resumed.history[-1]["val_accuracy"] == pytest.approx(whole.history[-1]["val_accuracy"], abs=1e-6)
    assert remote.evaluate(resumed.checkpoint) == pytest.approx(local.evaluate(whole.checkpoint), abs=1e-6)
    for name, tensor in state(whole).items():
        assert torch.allclose(state(resumed)[name], tensor, atol=1e-6), name
    assert resumed.info["world_size"] == 2 and resumed.info["attempts"] == 1
