"""When a trial-rung whose ranks exited non-zero keeps its result: the launcher's summary and the checkpoint."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from prefect_hyperband.trainers.exits import checkpoint_complete, failed_ranks, summary_ranks, why_kept

#: torch 2.13's launcher, as printed when rank 0 aborted after destroy_process_group() and rank 1 was stopped
SUMMARY = """fsdp.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_20:24:38
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 2266)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 2266
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_20:24:38
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -6 (pid: 2265)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 2265
======================================================
"""


def test_the_launchers_failed_ranks_come_root_cause_first():
    assert failed_ranks(SUMMARY) == [(0, -6), (1, -15)]
    assert failed_ranks("no summary at all") == []


def test_the_summary_gives_each_failed_rank_with_its_exit_code_as_printed():
    assert summary_ranks(SUMMARY) == [(1, "-15 (pid: 2266) (SIGTERM)"), (0, "-6 (pid: 2265) (SIGABRT)")]
    assert summary_ranks(SUMMARY.partition("Root Cause")[2]) == [(0, "-6 (pid: 2265) (SIGABRT)")]


def dcp(folder: Path, ranks: range, metadata: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in ranks:
        (folder / f"__{rank}_0.distcp").write_bytes(b"x" * 10)
    if metadata:
        (folder / ".metadata").write_bytes(b"m")
    return folder


def test_a_dcp_checkpoint_is_complete_with_its_metadata_and_a_part_from_every_rank(tmp_path: Path):
    assert "a part from each of 2 rank(s)" in checkpoint_complete(dcp(tmp_path / "a", range(2)), 2)
    assert checkpoint_complete(dcp(tmp_path / "b", range(1)), 2) is None  # rank 1's part missing
    assert checkpoint_complete(dcp(tmp_path / "c", range(2), metadata=False), 2) is None
    nested = tmp_path / "d"
    dcp(nested / "model", range(2))
    (nested / "extra.json").write_text("{}")
    assert checkpoint_complete(nested, 2) is not None


def test_a_torch_save_file_cut_short_makes_the_checkpoint_incomplete(tmp_path: Path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:  # torch.save's format: a zip archive
        archive.writestr("model/data.pkl", b"p" * 5000)
    whole = buffer.getvalue()
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "model.pt").write_bytes(whole)
    assert checkpoint_complete(tmp_path / "ok", 2) == "its checkpoint's 1 file(s) are whole"
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "model.pt").write_bytes(whole[: len(whole) // 2])
    assert checkpoint_complete(tmp_path / "torn", 2) is None


def test_an_empty_or_missing_checkpoint_is_not_complete(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    assert checkpoint_complete(tmp_path / "empty", 1) is None
    assert checkpoint_complete(tmp_path / "missing", 1) is None


def test_the_reason_names_the_rank_its_signal_and_what_was_checked():
    assert why_kept(0, -6, 9, "its checkpoint's 1 file(s) are whole") == (
        "rank 0 exited with code -6 (SIGABRT) after rank 0 reported r=9 and its checkpoint's 1 file(s) are whole: "
        "the result is kept")
    assert "code 1 (its own exit)" in why_kept(1, 1, 3, "x")


def test_a_failure_names_the_rank_that_failed_before_the_one_that_only_lost_it(tmp_path: Path):
    """Rank 1 exits on an error of its own; rank 0's collective then loses it (gloo's "Connection closed by peer")
    and aborts first, so torch's launcher names rank 0 as the root cause. The message names rank 1 first, with its
    error, then rank 0; a root cause of its own, or a peer stopped by the launcher, stays as the launcher says."""
    from prefect_hyperband.trainers.launch import failure_message

    lost_first = SUMMARY.replace("exitcode  : -15 (pid: 2266)  (SIGTERM)", "exitcode  : 1 (pid: 2266)")
    (tmp_path / "launcher.log").write_text(lost_first)
    (tmp_path / "rank0.stderr").write_text("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer\n"
                                          "terminate called without an active exception\n")
    (tmp_path / "rank1.stderr").write_text("RuntimeError: injected failure (exit) at rank 1, epoch 2\n")
    message = failure_message(tmp_path, "torch trial failed")
    assert message.splitlines()[0] == "torch trial failed (failed ranks: 1, 0; exit code 1 (pid: 2266); -6 (pid: 2265) (SIGABRT))"
    assert message.index("injected failure") < message.index("Connection closed by peer")
    (tmp_path / "rank0.stderr").write_text("ValueError: a bug of rank 0's own\n")
    assert "(failed rank: 0;" in failure_message(tmp_path, "torch trial failed")
    (tmp_path / "launcher.log").write_text(SUMMARY)  # rank 1 stopped by the launcher: rank 0 stays the cause
    (tmp_path / "rank0.stderr").write_text("Connection closed by peer\n")
    (tmp_path / "rank1.stderr").write_text("")
    assert "(failed rank: 0;" in failure_message(tmp_path, "torch trial failed")
