"""torch's launcher as the trainers start it (``trainers.launch.torch_launcher``)."""

from __future__ import annotations

import os
import subprocess

import pytest

from prefect_hyperband.trainers.launch import torch_launcher


@pytest.mark.slow  # real processes: torch's launcher and its ranks
def test_the_launcher_command_runs_torchs_launcher_with_its_exit_codes(tmp_path):
    """``python -m torch.distributed.run`` under another name: the ranks get torchrun's contract, a run whose ranks
    all succeed exits 0, one with a failed rank exits 1 naming it in torch's failure report."""
    script = tmp_path / "rank.py"
    # each rank's line in one write: the two ranks share the pipe, and print's pieces (unbuffered: one write each)
    # interleaved under load in CI ("10 2", " 2")
    script.write_text("import os, sys\nos.write(1, f\"{os.environ['RANK']} {os.environ['WORLD_SIZE']}\\n\".encode())\n"
                      "sys.exit(int(os.environ.get('FAIL_RANK', '-1')) == int(os.environ['RANK']) and 3)\n")
    args = ["--standalone", "--nnodes", "1", "--nproc-per-node", "2", str(script)]
    ok = subprocess.run([*torch_launcher(), *args], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert sorted(ok.stdout.split("\n")[:2]) == ["0 2", "1 2"]
    failed = subprocess.run([*torch_launcher(), *args], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "FAIL_RANK": "1"})
    assert failed.returncode == 1
    assert "ChildFailedError" in failed.stderr and "rank      : 1" in failed.stderr and "exitcode  : 3" in failed.stderr
