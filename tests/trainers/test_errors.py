"""What a trial's error looks like on the job's terminal line."""

from __future__ import annotations

from prefect_hyperband.common.errors import SHOWN_CHARS, shown


def test_a_huge_error_is_cut_and_a_script_s_control_characters_are_escaped():
    """Found by a fuzz: a 2 MB exception message was printed whole on its trial's warning line, and a script's NUL
    and escape sequences reached the terminal raw."""
    assert shown("exited with code 1; last output:\n\tline\x00one\x1b[2Jtwo\u2028") == \
        "exited with code 1; last output:\n\tline\\x00one\\x1b[2Jtwo\\u2028"
    line = shown("ValueError: " + "x" * 2_000_000)
    assert len(line) < SHOWN_CHARS + 100 and line.startswith("ValueError: xxx")
    assert line.endswith("(cut at 2,000 characters; the whole error is in the task run's log and job.log)")
    assert shown("ValueError: short") == "ValueError: short"
