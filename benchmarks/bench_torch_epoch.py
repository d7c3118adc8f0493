"""The torch trainer's epoch against a plain PyTorch loop over the same tensors (issue 76).

A table of ``--rows`` x ``--features`` (generated, float32, a binary label; Parquet parts in a temporary folder) is
trained for ``--epochs`` epochs by the built-in torch trainer (one rank, a cold launch: ``TorchTrainer.train``), and
the same model (``trainers.torch.models.build_model`` of the same architecture), batch, optimiser (SGD with the config's
momentum and weight decay) and thread count are trained in this process by a plain loop over the training rows
already on the device (``randperm``, index, forward, backward, step). Per batch size it prints one line, and with
``--json`` one JSON document: ``ours_s_per_epoch`` (the trainer's training passes, measured by its rank), ``plain_s_per_epoch``
and their ``ratio``; ``ours_epoch_with_validation_s`` adds the rank's validation after each epoch (the plain loop
has none). Run from the repository root: ``python benchmarks/bench_torch_epoch.py --json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # a source checkout (no Prefect needed: ``gpu_check.py`` runs this on a bare GPU machine)
    sys.path.insert(0, str(ROOT))


def write_table(folder: Path, rows: int, features: int, parts: int = 4, seed: int = 0) -> None:
    """``rows`` x ``features`` float32 columns and a binary label, in ``parts`` Parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(np.diff(np.linspace(0, rows, parts + 1).astype(int))):
        x = rng.normal(size=(n, features)).astype(np.float32)
        label = (x[:, 0] * x[:, 1] + x[:, 2] - 0.5 * x[:, 3] > 0).astype(np.int64)
        columns = {f"f{j}": x[:, j] for j in range(features)} | {"label": label}
        pq.write_table(pa.table(columns), folder / f"part-{i}.parquet")


def ours(spec, config: dict, epochs: int, threads: int, scratch: Path, gpus: tuple[int, ...] | None = (),
         **knobs) -> tuple[float, float, dict]:
    """The trainer's seconds per training pass and per epoch with its validation (its rank's own timings), and its
    call's ``info``; ``gpus`` (0,): on GPU 0, (): on the CPU."""
    from prefect_hyperband.trainers.torch.ddp import TorchTrainer

    trainer = TorchTrainer(spec, workers=1, warm=False, threads_per_rank=threads, scratch_dir=str(scratch), gpus=gpus,
                           **knobs)
    info = trainer.train(config, epochs, None, str(scratch / f"b{config['batch_size']}.pt")).info
    return float(info["pass_seconds"]) / epochs, float(info["epoch_seconds"]), info


def plain(spec, config: dict, epochs: int, threads: int, device: str = "cpu") -> float:
    """A plain loop's seconds per epoch: the trainer's model, batch and optimiser, the rows already tensors on
    ``device``."""
    import torch

    from prefect_hyperband.trainers.data import load
    from prefect_hyperband.trainers.torch.models import build_model, fit_standardisation

    torch.set_num_threads(threads)
    ds = load(spec)
    X = torch.from_numpy(np.ascontiguousarray(ds.X_train)).to(device)
    y = torch.from_numpy(ds.y_train.astype(np.int64)).to(device)
    torch.manual_seed(0)
    model = build_model({"kind": "mlp", "n_features": X.shape[1], "n_outputs": 2, "width": config["width"],
                         "dropout": config["dropout"], "image_shape": None, "task": "binary"})
    model.set_standardisation(*fit_standardisation(ds.X_train, image=False))
    model.to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"],
                                weight_decay=config["weight_decay"])
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    began = time.perf_counter()
    for _ in range(epochs):
        for batch in torch.randperm(len(X), device=device).split(config["batch_size"]):
            loss = loss_fn(model(X[batch]), y[batch])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
    if device != "cpu":
        torch.cuda.synchronize()
    return (time.perf_counter() - began) / epochs


def compare(spec, batch: int, epochs: int, threads: int, scratch: Path, repeats: int = 2,
            gpus: tuple[int, ...] | None = ()) -> dict:
    """Ours against the plain loop at ``batch``, alternated ``repeats`` times, the best of each (a busy machine's
    noise falls on both)."""
    from prefect_hyperband.trainers.torch.config import DEFAULT_CONFIG

    config, device = {**DEFAULT_CONFIG, "batch_size": batch}, "cuda:0" if gpus else "cpu"
    plains, passes, epochs_with_validation = [], [], []
    for _ in range(repeats):
        plains.append(plain(spec, config, epochs, threads, device))
        one, with_validation, _ = ours(spec, config, epochs, threads, scratch, gpus)
        passes.append(one)
        epochs_with_validation.append(with_validation)
    ours_s, plain_s = min(passes), min(plains)
    return {"batch_size": batch, "ours_s_per_epoch": round(ours_s, 4), "plain_s_per_epoch": round(plain_s, 4),
            "ratio": round(ours_s / plain_s, 3), "ours_epoch_with_validation_s": round(min(epochs_with_validation), 4),
            "device": device}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--batch-sizes", default="32,512", help="comma-separated (32: the default config's)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads, both sides")
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the two; the best of each counts")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)

    from prefect_hyperband.trainers.data import DataSpec
    from prefect_hyperband.trainers.torch.config import DEFAULT_CONFIG

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-torch-epoch-") as tmp:
        folder = Path(tmp) / "table"
        write_table(folder, args.rows, args.features)
        spec = DataSpec(str(folder), target="label")
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            row = compare(spec, batch, args.epochs, args.threads, Path(tmp), args.repeats)
            results.append(row)
            if not args.json:
                print(f"batch {batch}: ours {row['ours_s_per_epoch']:.3f} s/epoch, plain loop "
                      f"{row['plain_s_per_epoch']:.3f} s/epoch, ratio {row['ratio']:.3f} (with the rank's validation: "
                      f"{row['ours_epoch_with_validation_s']:.3f} s)", flush=True)
    if args.json:
        print(json.dumps({"rows": args.rows, "features": args.features, "epochs": args.epochs,
                          "threads": args.threads, "repeats": args.repeats, "config": {k: v for k, v in DEFAULT_CONFIG.items()},
                          "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
