"""Issue 76: a host's GPUs as a pool of whole GPUs. On this CPU machine placement is what each trial-rung is given:
the ids (``--gpus``), ``CUDA_VISIBLE_DEVICES`` for its processes, one line and exit 2 for too few GPUs."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time

import pytest

from prefect_hyperband.common.errors import InputError
from prefect_hyperband.trainers import gpus


def test_gpus_parse_and_the_choice_of_device():
    assert gpus.parse("0, 2,3") == (0, 2, 3) and gpus.parse([1]) == (1,) and gpus.parse(None) is None
    for bad in ("", "a", "0,0", "-1", "0;1"):
        with pytest.raises(InputError, match="--gpus"):
            gpus.parse(bad)
    assert gpus.choose("cpu", None, 4) == ()  # the CPU, asked for: CUDA_VISIBLE_DEVICES set empty
    assert gpus.choose("auto", "0,1,2,3", 2) == (0, 1, 2, 3)
    assert gpus.choose("auto", None, 8, on_dask=True) is None  # a Dask cluster's GPUs are its workers'
    with pytest.raises(InputError, match=r"^--workers 2 puts a rank on each of 2 GPUs of one host, but --gpus gives 1"):
        gpus.choose("auto", "0", 2)
    with pytest.raises(InputError, match="--device cpu keeps every trial on the CPU"):
        gpus.choose("cpu", "0", 1)
    with pytest.raises(InputError, match="--device must be one of auto, cpu, cuda"):
        gpus.choose("tpu", None, 1)


def test_the_visible_gpus_follow_cuda_visible_devices_else_nvidia_smi(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-5b1e,7")
    assert gpus.visible() == (0, 1, 2)  # CUDA renumbers what it is shown
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,2")
    assert gpus.visible() == (0,)  # CUDA stops at an invalid id
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpus.visible() == ()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(gpus.shutil, "which", lambda name: None)
    assert gpus.visible() == ()  # no driver here
    with pytest.raises(InputError, match="--device cuda: no GPU is visible here"):
        gpus.choose("cuda", None, 1)
    assert gpus.choose("auto", None, 1) is None  # a CPU machine: nothing placed, the environment as it is


def test_concurrent_leases_hold_disjoint_sets_and_a_lease_waits_for_one_to_end():
    pool = gpus.GpuPool((0, 1, 2, 3, 4), 2)
    assert pool.slots == 2 and gpus.groups((0, 1, 2, 3, 4), 2) == [(0, 1), (2, 3)]  # GPU 4 left idle
    held, lock, waited = [], threading.Lock(), []

    def trial(n: int) -> None:
        began = time.monotonic()
        with pool.lease() as ids:
            with lock:
                waited.append(time.monotonic() - began)
                assert all(not set(ids) & set(other) for other in held)
                held.append(ids)
            time.sleep(0.2)
            with lock:
                held.remove(ids)

    threads = [threading.Thread(target=trial, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(waited)[-1] >= 0.15  # the third waited for a set to come back
    assert gpus.env_for((2, 3)) == {"CUDA_VISIBLE_DEVICES": "2,3"} and gpus.env_for(()) == {"CUDA_VISIBLE_DEVICES": ""}
    assert gpus.env_for(None) == {}
    with gpus.GpuPool(None, 1).lease() as ids:
        assert ids is None


SCRIPT = textwrap.dedent("""\
    import json, os, time
    began = time.time()
    time.sleep(0.5)
    with open(os.environ["HYPERBAND_REPORT_FILE"], "a") as f:
        seen = os.environ.get("CUDA_VISIBLE_DEVICES")
        f.write(json.dumps({"step": int(os.environ["HYPERBAND_RESOURCE"]), "score": 1.0,
                            "gpu": int(seen) if seen else -1, "began": began, "ended": time.time()}) + "\\n")
""")


def _side_by_side(train, n: int = 2) -> list:
    """``n`` trial-rungs at once, each in a thread of its own (as the job's runner trains them)."""
    out: list = [None] * n

    def one(i: int) -> None:
        out[i] = train(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_two_scripts_at_once_given_gpus_0_1_see_cuda_visible_devices_0_and_1(tmp_path):
    from prefect_hyperband.trainers.script import ScriptTrainer

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    trainer = ScriptTrainer(str(script), "score", gpus=(0, 1))
    results = _side_by_side(lambda i: trainer.train({}, 1, None, str(tmp_path / f"t{i}" / "r1.json")))
    seen = sorted((r.history[-1]["gpu"], r.history[-1]["began"], r.history[-1]["ended"]) for r in results)
    assert [s[0] for s in seen] == [0, 1] and seen[1][1] < seen[0][2]  # both at once, each on its own GPU
    assert all(r.info["gpus"] == 1.0 for r in results)
    alone = ScriptTrainer(str(script), "score", gpus=())  # --device cpu: no GPU shown to the script
    assert alone.train({}, 1, None, str(tmp_path / "cpu" / "r1.json")).history[-1]["gpu"] == -1


def test_two_functions_at_once_given_gpus_0_1_get_one_each_as_trial_gpus(tmp_path, monkeypatch):
    from prefect_hyperband.trainers.function import FunctionTrainer

    (tmp_path / "fn.py").write_text(textwrap.dedent("""\
        import time
        def train(trial):
            began = time.time()
            time.sleep(0.3)
            return {"score": 1.0, "gpu": trial.gpus[0], "began": began, "ended": time.time(),
                    "on_its_gpu": float(trial.device == f"cuda:{trial.gpus[0]}")}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = FunctionTrainer(f"{tmp_path / 'fn.py'}:train", "score", gpus=(0, 1))
    seen = []

    def train(i):
        result = trainer.train({}, 1, None, str(tmp_path / f"f{i}" / "r1.json"))
        seen.append(json.loads((tmp_path / f"f{i}" / "r1.json").read_text())["metrics"])
        return result

    results = _side_by_side(train)
    assert sorted(m["gpu"] for m in seen) == [0.0, 1.0] and all(r.info["gpus"] == 1.0 for r in results)
    assert all(m["on_its_gpu"] == 1.0 for m in seen)
    first, second = sorted(seen, key=lambda m: m["began"])
    assert second["began"] < first["ended"]  # at once


def test_the_torch_trainer_gives_each_warm_pool_its_own_gpus_and_the_ranks_their_environment(tmp_path):
    pytest.importorskip("torch")
    from prefect_hyperband.executors.torch_pool import warm_pools
    from prefect_hyperband.trainers.data import DataSpec
    from prefect_hyperband.trainers.torch.ddp import TorchTrainer

    trainer = TorchTrainer(DataSpec("digits"), workers=2, gpus=(0, 1, 2, 3), pools=warm_pools, deterministic=True)
    assert trainer.pool_size == 2 and [trainer.gpu_group(n) for n in (0, 1)] == [(0, 1), (2, 3)]
    env = trainer.environment(trainer.gpu_group(1))
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert TorchTrainer(DataSpec("digits"), gpus=()).environment(())["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in TorchTrainer(DataSpec("digits")).environment() or \
        os.environ.get("CUDA_VISIBLE_DEVICES") is not None  # no placement: the environment as it is
    assert sys.modules.get("prefect_hyperband.trainers.gpus") is gpus


@pytest.mark.slow  # a torch rank
def test_a_deterministic_torch_trial_on_the_cpu_says_so_and_holds_no_gpu(tmp_path):
    pytest.importorskip("torch")
    from prefect_hyperband.trainers.data import DataSpec
    from prefect_hyperband.trainers.torch.ddp import TorchTrainer

    trainer = TorchTrainer(DataSpec("digits"), warm=False, threads_per_rank=1, gpus=(), deterministic=True)
    info = trainer.train({}, 1, None, str(tmp_path / "r1.pt")).info
    assert info["deterministic"] == 1.0 and info["gpus"] == 0.0 and info["pass_seconds"] > 0
    plain = TorchTrainer(DataSpec("digits"), warm=False, threads_per_rank=1)
    assert plain.train({}, 1, None, str(tmp_path / "p1.pt")).info["deterministic"] == 0.0
