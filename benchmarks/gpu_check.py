"""A GPU check in one call (issue 76): what a GPU machine does with the torch trainer and XGBoost, one line a check.

Runs from a source checkout on a machine with torch (CUDA or not) and numpy, pandas, pyarrow, scikit-learn, without
Prefect, MLflow or XGBoost (a check that needs one it lacks says "skipped"); on a CPU machine every GPU check says so
and the CPU's are measured. ``--out FILE`` writes the figures as JSON::

    python benchmarks/gpu_check.py --out gpu_check.json

Checks: the devices torch sees; the device and backend the ranks used; the trainer's epoch against a plain loop over
the same tensors (``bench_torch_epoch``), on the GPU and on the CPU; bf16 autocast against fp32; a trial resumed
against one trained straight (``--deterministic``); two trials at once on disjoint GPUs where there are two; XGBoost
on CUDA (resumed against straight, seconds against the CPU) where xgboost imports. Run from the repository root (or
any folder: it finds the checkout from its own path).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_torch_epoch as epoch  # noqa: E402


def devices(ctx: dict) -> dict:
    import torch

    from prefect_hyperband.trainers import gpus

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "visible": list(gpus.visible()), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        out["names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["bf16_supported"] = torch.cuda.is_bf16_supported()
    return out


def ranks(ctx: dict) -> dict:
    _, _, info = epoch.ours(ctx["spec"], {**ctx["config"], "batch_size": 512}, 1, ctx["threads"], ctx["tmp"], ctx["gpus"])
    return {k: info.get(k) for k in ("device", "visible", "gpus", "world_size", "pass_seconds")} | {
        "backend": "nccl" if str(info.get("device", "")).startswith("cuda") else "gloo"}


def _epochs(ctx: dict, gpus: tuple[int, ...]) -> dict:
    return {str(b): epoch.compare(ctx["spec"], b, ctx["epochs"], ctx["threads"], ctx["tmp"], ctx["repeats"], gpus)
            for b in (32, 512)}


def epoch_gpu(ctx: dict) -> dict | None:
    return _epochs(ctx, (0,)) if ctx["gpus"] else None


def epoch_cpu(ctx: dict) -> dict:
    return _epochs(ctx, ())


def bf16(ctx: dict) -> dict:
    config = {**ctx["config"], "batch_size": 512}
    fp32 = epoch.ours(ctx["spec"], config, ctx["epochs"], ctx["threads"], ctx["tmp"], ctx["gpus"])
    half = epoch.ours(ctx["spec"], config, ctx["epochs"], ctx["threads"], ctx["tmp"], ctx["gpus"], precision="bf16")
    return {"fp32_s_per_epoch": round(fp32[0], 4), "bf16_s_per_epoch": round(half[0], 4),
            "speedup": round(fp32[0] / half[0], 3), "on": "cuda:0" if ctx["gpus"] else "cpu"}


def resume(ctx: dict) -> dict:
    import torch

    from prefect_hyperband.trainers.torch.ddp import TorchTrainer

    trainer = TorchTrainer(ctx["spec"], warm=False, threads_per_rank=ctx["threads"], scratch_dir=str(ctx["tmp"]),
                           gpus=ctx["gpus"], deterministic=True)
    config, tmp = {**ctx["config"], "batch_size": 512}, ctx["tmp"]
    straight = trainer.train(config, 3, None, str(tmp / "straight.pt"))
    first = trainer.train(config, 1, None, str(tmp / "first.pt"))
    resumed = trainer.train(config, 3, first.checkpoint, str(tmp / "resumed.pt"))
    a, b = (torch.load(c.checkpoint, weights_only=True)["model"] for c in (straight, resumed))
    gap = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    return {"max_weight_gap": gap, "within_1e-6": gap <= 1e-6, "device": straight.info.get("device"),
            "deterministic": straight.info.get("deterministic")}


def two_trials(ctx: dict) -> dict | None:
    if len(ctx["gpus_all"]) < 2:
        return None
    from prefect_hyperband.trainers.torch.ddp import TorchTrainer

    trainer = TorchTrainer(ctx["spec"], warm=False, threads_per_rank=ctx["threads"], scratch_dir=str(ctx["tmp"]),
                           gpus=ctx["gpus_all"][:2], concurrent_trials=2)
    seen: list[Any] = [None, None]

    def one(i: int) -> None:
        seen[i] = trainer.train({**ctx["config"], "batch_size": 512}, 1, None, str(ctx["tmp"] / f"two{i}.pt")).info

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    visible = sorted(str(s.get("visible")) for s in seen if s)
    return {"visible": visible, "disjoint": len(set(visible)) == 2}


def xgboost_cuda(ctx: dict) -> dict | None:
    try:
        import xgboost  # noqa: F401
    except ImportError:
        return None
    import numpy as np

    from prefect_hyperband.trainers.xgboost.trainer import XGBoostTrainer

    out: dict[str, Any] = {"version": xgboost.__version__}
    for name, ids in (("cpu", ()), ("cuda", (0,) if ctx["gpus"] else None)):
        if ids is None:
            continue
        trainer = XGBoostTrainer(ctx["spec"], gpus=ids, milestones=(1, 3))
        began = time.perf_counter()
        straight = trainer.train({}, 3, None, str(ctx["tmp"] / f"x-{name}-3.ubj"))
        seconds = time.perf_counter() - began
        first = trainer.train({}, 1, None, str(ctx["tmp"] / f"x-{name}-1.ubj"))
        resumed = trainer.train({}, 3, first.checkpoint, str(ctx["tmp"] / f"x-{name}-r3.ubj"))
        X = trainer.data.X_val[:2000]
        same = bool(np.array_equal(trainer.predict(straight.checkpoint, X), trainer.predict(resumed.checkpoint, X)))
        out[name] = {"seconds_to_3": round(seconds, 3), "resumed_equals_straight": same, "gpus": straight.info["gpus"]}
    return out


CHECKS: list[tuple[str, Callable[[dict], dict | None]]] = [
    ("devices", devices), ("ranks", ranks), ("epoch_gpu", epoch_gpu), ("epoch_cpu", epoch_cpu), ("bf16", bf16),
    ("resume", resume), ("two_trials", two_trials), ("xgboost_cuda", xgboost_cuda),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the figures here as JSON")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    parser.add_argument("--only", help="comma-separated checks to run (default: all)")
    args = parser.parse_args(argv)

    from prefect_hyperband.trainers import gpus
    from prefect_hyperband.trainers.data import DataSpec
    from prefect_hyperband.trainers.torch.config import DEFAULT_CONFIG

    every = gpus.visible()
    report: dict[str, Any] = {"argv": sys.argv[1:], "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "checks": {}}
    only = set(args.only.split(",")) if args.only else None
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        folder = Path(tmp) / "table"
        epoch.write_table(folder, args.rows, 32)
        ctx = {"spec": DataSpec(str(folder), target="label"), "config": dict(DEFAULT_CONFIG), "tmp": Path(tmp),
               "threads": args.threads, "epochs": args.epochs, "repeats": args.repeats, "gpus": every[:1],
               "gpus_all": every}
        for name, check in CHECKS:
            if only is not None and name not in only:
                continue
            began = time.perf_counter()
            try:
                figures = check(ctx)
                status = "skipped (no GPU, or no xgboost)" if figures is None else "ok"
            except Exception as exc:  # one check failing is a figure too; the others still run
                figures, status = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}, "failed"
            report["checks"][name] = {"status": status, "seconds": round(time.perf_counter() - began, 1),
                                      **({"figures": figures} if figures is not None else {})}
            shown = json.dumps({k: v for k, v in (figures or {}).items() if k != "trace"}, default=str)
            print(f"{name}: {status} ({report['checks'][name]['seconds']} s) {shown}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    return 0 if all(c["status"] != "failed" for c in report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
