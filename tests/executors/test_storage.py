"""The job's storage: a folder used in place, or an object store (moto's S3 server on loopback, through s3fs)
that a second machine's mirror reads back byte for byte."""

from __future__ import annotations

import pytest
from ports import free_port  # tests/ports.py

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.executors.state import job_store
from prefect_hyperband.executors.storage import Storage, check


def test_a_folder_is_used_in_place(tmp_path):
    store = Storage(str(tmp_path / "job"), str(tmp_path / "job"))
    assert store.read_json("state.json") is None
    store.write_json("state.json", {"rows": [1, 2]})
    assert store.read_json("state.json") == {"rows": [1, 2]}
    path = str(tmp_path / "job" / "checkpoints" / "t" / "r1.ubj")
    assert store.publish(path) == path and store.fetch(path) == path  # no copies
    store.delete("state.json")
    assert store.read_json("state.json") is None


def test_an_object_store_round_trips_state_and_checkpoints_between_two_mirrors(s3, tmp_path):
    a = job_store(tmp_path / "machine-a" / "j1", "j1", "s3://bucket/jobs")
    assert a.root == "s3://bucket/jobs/j1" and not a.local
    a.write_json("state.json", {"rows": [{"trial_id": "t"}]}, indent=None)
    assert s3.cat_file("bucket/jobs/j1/state.json") == b'{"rows": [{"trial_id": "t"}]}'

    checkpoint = tmp_path / "machine-a" / "j1" / "checkpoints" / "t" / "r3.ubj"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"\x00booster")
    folder = tmp_path / "machine-a" / "j1" / "checkpoints" / "t" / "r3"  # a script's checkpoint folder
    (folder / "sub").mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"weights")
    (folder / "sub" / "opt.pt").write_bytes(b"optimizer")
    url, folder_url = a.publish(str(checkpoint)), a.publish(str(folder))
    assert url == "s3://bucket/jobs/j1/checkpoints/t/r3.ubj"
    a.publish(str(folder))  # again (a retried trial-rung): replaced, not nested
    assert sorted(s3.find("bucket/jobs/j1/checkpoints/t/r3")) == [
        "bucket/jobs/j1/checkpoints/t/r3/model.pt", "bucket/jobs/j1/checkpoints/t/r3/sub/opt.pt"]

    b = job_store(tmp_path / "machine-b" / "j1", "j1", "s3://bucket/jobs")  # another machine: its own mirror
    local = b.fetch(url)
    assert local == str(tmp_path / "machine-b" / "j1" / "checkpoints" / "t" / "r3.ubj")
    assert open(local, "rb").read() == b"\x00booster"
    local_folder = b.fetch(folder_url)
    assert open(f"{local_folder}/sub/opt.pt", "rb").read() == b"optimizer"
    assert b.read_json("state.json") == {"rows": [{"trial_id": "t"}]}
    assert b.read_json("missing.json") is None
    b.delete("state.json")
    b.delete("state.json")  # gone already: fine
    assert a.read_json("state.json") is None


def test_storage_that_cannot_be_used_is_one_line(s3, tmp_path):
    with pytest.raises(InputError, match="cannot write there"):
        check("s3://no-such-bucket/jobs")
    with pytest.raises(InputError, match="no filesystem for nosuch://"):
        check("nosuch://x/y")
    with pytest.raises(InputError, match=r"^--storage s3://: names no bucket \(e.g. s3://bucket/jobs\)$"):
        check("s3://")  # it was botocore's "Invalid bucket name" over several lines
    # a filesystem whose URL names its host (FTP here): that host, and one line when it does not answer (it was a
    # TypeError for the missing host, and fsspec's traceback at exit)
    port = free_port("127.0.0.1")
    with pytest.raises(InputError, match=rf"--storage ftp://127.0.0.1:{port}/jobs: cannot open it: ConnectionRefused"):
        check(f"ftp://127.0.0.1:{port}/jobs")
    check("s3://bucket/jobs")  # writable: no error, no probe left behind
    assert not s3.find("bucket/jobs/.hyperband-probe")


def _damage(path, how: str) -> None:
    text = path.read_text()
    path.write_text("" if how == "empty" else text[: len(text) // 2])


@pytest.mark.parametrize("how", ["empty", "truncated"])
def test_a_damaged_document_falls_back_on_its_previous_version_and_says_so_once(tmp_path, how):
    store = Storage(str(tmp_path / "job"), str(tmp_path / "job"))
    store.write_json("state.json", {"rows": [1]}, keep_previous=True)
    store.write_json("state.json", {"rows": [1, 2]}, keep_previous=True)
    _damage(tmp_path / "job" / "state.json", how)

    value, notice = store.read_kept("state.json", lambda v: v["rows"])
    assert value == [1]  # the previous version: one result back
    assert notice.startswith(f"{store.url('state.json')} is damaged (JSONDecodeError") and "state.json.prev" in notice
    assert (tmp_path / "job" / "state.json.damaged").exists()
    assert store.read_kept("state.json", lambda v: v["rows"]) == ([1], None)  # restored: said once
    store.write_json("state.json", {"rows": [1, 3]}, keep_previous=True)  # the job goes on from it
    assert store.read_json("state.json.prev") == {"rows": [1]}


def test_a_document_its_reader_rejects_is_damaged_too(tmp_path):
    store = Storage(str(tmp_path), str(tmp_path))
    store.write_json("job.json", {"params": {}}, keep_previous=True)
    store.write_json("job.json", {"hand": "edited"}, keep_previous=True)
    value, notice = store.read_kept("job.json", lambda v: v["params"])
    assert value == {} and "damaged (KeyError" in notice


def test_nothing_good_left_is_one_line_naming_the_file(tmp_path):
    store = Storage(str(tmp_path), str(tmp_path))
    assert store.read_kept("state.json", lambda v: v) == (None, None)  # a new job
    store.write_json("state.json", {"rows": []})  # no previous version
    (tmp_path / "state.json").write_text("{")
    with pytest.raises(InputError, match=r"state.json is damaged \(JSONDecodeError.*and it has no previous version"):
        store.read_kept("state.json", lambda v: v)
    (tmp_path / "state.json.prev").write_text("")
    with pytest.raises(InputError) as err:
        store.read_kept("state.json", lambda v: v)
    assert "and so is its previous version" in str(err.value) and "\n" not in str(err.value)


def test_an_object_store_keeps_the_previous_version_too(s3, tmp_path):
    store = Storage("s3://bucket/kept", str(tmp_path))
    store.write_json("state.json", {"rows": [1]}, keep_previous=True)
    store.write_json("state.json", {"rows": [1, 2]}, keep_previous=True)
    s3.pipe_file("bucket/kept/state.json", b'{"rows": [1,')
    value, notice = store.read_kept("state.json", lambda v: v["rows"])
    assert value == [1] and "damaged" in notice and s3.exists("bucket/kept/state.json.damaged")


def test_keeping_the_previous_version_ignores_a_link_a_killed_process_left(tmp_path):
    """A process killed between its link and its rename leaves ``<key>.prev.<pid>.tmp``; a later process with the
    same pid (pids are reused) still keeps its previous version."""
    import os

    from prefect_hyperband.executors.storage import PREVIOUS, Storage

    store = Storage(str(tmp_path), str(tmp_path))
    store.write_json("state.json", {"n": 1}, keep_previous=True)
    (tmp_path / f"state.json{PREVIOUS}.{os.getpid()}.tmp").write_text("left by a killed process")
    store.write_json("state.json", {"n": 2}, keep_previous=True)
    store.write_json("state.json", {"n": 3}, keep_previous=True)
    assert store.read_json("state.json") == {"n": 3} and store.read_json("state.json" + PREVIOUS) == {"n": 2}
