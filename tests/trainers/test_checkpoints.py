"""What a damaged checkpoint looks like to the job, whatever the trainer's format."""

from __future__ import annotations

from prefect_hyperband.trainers.base import checkpoint_damage, write_sidecar


def test_a_whole_checkpoint_and_each_kind_of_damage(tmp_path):
    ckpt = tmp_path / "r3.ubj"
    ckpt.write_bytes(b"x" * 100)
    write_sidecar(str(ckpt), 3)
    assert checkpoint_damage(str(ckpt)) is None
    ckpt.write_bytes(b"x" * 60)  # a copy cut short
    assert checkpoint_damage(str(ckpt)) == "60 bytes where 100 were written"
    ckpt.write_bytes(b"")
    assert checkpoint_damage(str(ckpt)) == "empty (0 bytes)"
    ckpt.unlink()
    assert checkpoint_damage(str(ckpt)) == "missing"


def test_a_json_checkpoint_that_does_not_parse_is_damaged(tmp_path):
    ckpt = tmp_path / "r1.json"
    ckpt.write_text('{"resource": 1, "metrics": {"val_loss": 0.5}}')
    assert checkpoint_damage(str(ckpt)) is None  # user code's checkpoint: no sidecar
    ckpt.write_text('{"resource": 1, "metr')
    assert checkpoint_damage(str(ckpt)) == "unreadable (JSONDecodeError)"
