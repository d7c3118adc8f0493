"""A table big enough to distribute, where it lives: Parquet parts on a local folder and on an S3 server (moto's
server mode, on loopback), read by the Dask workers, never by the job's process.

Run from the repository root: ``.venv/bin/python benchmarks/bench_big_data.py [--sizes 100,1000] [--quick]``

For each size (MB of float32: 28 features and a label, a HIGGS-like nonlinear signal) and storage, it runs
``hyperband tune --data <folder or s3 URL> --target label --workers 2`` (R=9, eta 3) as a user would, and prints:
the job's process's peak RSS (sampled every 0.1 s, that process alone), the time to its first result (the journal's
first record), the seconds each group spent reading the table (job.log's lines) and how many times each read it, the
seconds per boosting round beside a plain ``xgboost.dask`` script on a cluster of the same shape and the same parts
(its anchor, measured in the same run), and the best AUC.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, wait_http  # noqa: E402

FEATURES = 28
PART_MB = 64


def write_table(folder: Path, megabytes: int, seed: int = 0) -> int:
    """Parquet parts of about ``PART_MB`` MB of float32 each; the label a nonlinear function of the features with
    noise (21 raw features, 7 products and squares of them, as HIGGS's low- and high-level features). Returns rows."""
    import numpy as np
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    rows = megabytes * 2**20 // ((FEATURES + 1) * 4)
    per_part = PART_MB * 2**20 // ((FEATURES + 1) * 4)
    rng = np.random.default_rng(seed)
    done, i = 0, 0
    while done < rows:
        n = min(per_part, rows - done)
        raw = rng.normal(size=(n, 21)).astype(np.float32)
        high = np.column_stack([raw[:, 0] * raw[:, 1], raw[:, 2] ** 2, raw[:, 3] * raw[:, 4], np.abs(raw[:, 5]),
                                raw[:, 6] * raw[:, 7] * raw[:, 8], np.sin(raw[:, 9]), raw[:, 10] ** 2 - raw[:, 11]])
        X = np.column_stack([raw, high]).astype(np.float32)
        signal = high[:, 0] - 0.8 * high[:, 1] + high[:, 2] + 0.5 * high[:, 4] + np.sin(2 * raw[:, 12]) + 0.3 * raw[:, 13]
        label = (signal + rng.normal(scale=1.0, size=n) > 0).astype(np.float32)
        frame = pd.DataFrame(X, columns=[f"f{j:02d}" for j in range(FEATURES)])
        frame["label"] = label
        frame.to_parquet(folder / f"part-{i:04d}.parquet", index=False)
        done, i = done + n, i + 1
    return rows


def run_job(data: str, workdir: Path, env: dict[str, str], rounds_per_unit: int | None,
            how: tuple[str, ...] = ("--workers", "2"), max_resource: int = 9) -> dict:
    """``hyperband tune`` on ``data``; the job's process's peak RSS (and its process tree's: Prefect's temporary
    server is its child) and first result, its groups' reads, per round."""
    import psutil

    workdir.mkdir(parents=True, exist_ok=True)
    argv = [str(Path(sys.executable).with_name("hyperband")), "tune", "--data", data, "--target", "label", *how,
            "--max-resource", str(max_resource), "--eta", "3",
            *(("--rounds-per-unit", str(rounds_per_unit)) if rounds_per_unit else ()),
            "--no-baseline", "--job-id", "big", "--json", "--tracking-uri", f"sqlite:///{workdir / 'mlflow.db'}"]
    began = time.monotonic()
    proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    me, peak, tree, first = psutil.Process(proc.pid), 0, 0, None
    job = workdir / "hyperband-jobs" / "big"
    while proc.poll() is None:
        try:
            peak = max(peak, me.memory_info().rss)
            tree = max(tree, peak, sum(_rss(p) for p in [me, *me.children(recursive=True)]))
        except psutil.Error:
            pass
        if first is None and any(job.glob("journal.*")) and any(p.stat().st_size for p in job.glob("journal.*")):
            first = time.monotonic() - began
        time.sleep(0.1)
    out, err = proc.communicate()
    wall = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"the job on {data} failed ({proc.returncode}): {err[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    reads = re.findall(r"group (\S+) read the table's (\d+) part\(s\) from \S+ in ([\d.]+) s",
                       (job / "job.log").read_text())
    rows = json.loads((job / "state.json").read_text())["rows"]
    seconds = sum(r["train_seconds"] for r in rows)
    rounds = sum(r["resource_trained"] for r in rows) * (rounds_per_unit or 1)  # torch: epochs
    return {"peak_mb": peak / 2**20, "tree_peak_mb": tree / 2**20, "first_s": first, "wall_s": wall, "reads": [(g, float(s)) for g, _, s in reads],
            "s_per_round": seconds / rounds, "train_s": seconds, "rounds": rounds, "auc": result["best"]["score"],
            "trial_rungs": len(rows)}


def _rss(process) -> int:
    import psutil

    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


def one_machine(tmp: Path, sizes: list[int], env: dict[str, str], rounds_per_unit: int) -> None:
    """Without Dask: each size trained in memory and with ``--external-memory``, beside a 5 MB table's run (the
    floor: what the job's processes hold whatever the table)."""
    runs = []
    floor_folder = tmp / "table-5"
    write_table(floor_folder, 5)
    for size, how in [(5, "memory"), *((s, h) for s in sizes for h in ("memory", "external memory"))]:
        folder = tmp / f"table-{size}"
        if not folder.exists():
            write_table(folder, size)
        flags = ("--external-memory",) if how == "external memory" else ()
        job = run_job(str(folder), tmp / f"one-{size}-{how.replace(' ', '-')}", env, rounds_per_unit, flags)
        runs.append({"size": size, "how": how, **job})
        print(json.dumps(runs[-1], default=str), flush=True)
    print()
    print("one machine, no Dask: peak RSS of the job's processes (the job's and Prefect's temporary server's), "
          "the job's wall time, the best AUC")
    print(f"{'size MB':>8} {'how':>16} {'tree peak MB':>12} {'job peak MB':>11} {'over 5 MB':>9} {'wall s':>7} "
          f"{'s/round':>8} {'AUC':>7}")
    floor = runs[0]["tree_peak_mb"]
    for r in runs:
        print(f"{r['size']:>8} {r['how']:>16} {r['tree_peak_mb']:>12.0f} {r['peak_mb']:>11.0f} "
              f"{r['tree_peak_mb'] - floor:>9.0f} {r['wall_s']:>7.1f} {r['s_per_round']:>8.3f} {r['auc']:>7.4f}")


def anchor(folder: Path, rounds: int = 30) -> tuple[float, float]:
    """A plain xgboost.dask script: a LocalCluster of 2 single-threaded workers, the same parts through
    ``dask.dataframe.read_parquet``, the job's default config (depth 6, eta 0.3, hist). Returns the seconds per
    boosting round of one long call, and the fixed seconds of one ``train`` call (``t(k) = fixed + k * round``, from
    calls of 3 and ``rounds`` rounds: xgboost.dask builds each worker's matrix again in every call)."""
    import dask.dataframe as dd
    from distributed import Client, LocalCluster
    from xgboost import dask as dxgb

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        frame = dd.read_parquet(str(folder))
        X, y = frame.drop(columns=["label"]), frame["label"]
        X, y = client.persist([X, y])
        dtrain = dxgb.DaskQuantileDMatrix(client, X, y)
        params = {"objective": "binary:logistic", "tree_method": "hist", "max_depth": 6, "eta": 0.3, "nthread": 1}
        dxgb.train(client, params, dtrain, num_boost_round=2)  # warm: the first call's set-up
        began = time.perf_counter()
        dxgb.train(client, params, dtrain, num_boost_round=rounds)
        long = time.perf_counter() - began
        began = time.perf_counter()
        dxgb.train(client, params, dtrain, num_boost_round=3)
        short = time.perf_counter() - began
        per_round = (long - short) / (rounds - 3)
        return long / rounds, max(0.0, short - 3 * per_round)


def torch_ranks(tmp: Path, sizes: list[int], env: dict[str, str]) -> None:
    """The torch model on each size, 2 DDP ranks on this machine (``--model torch --workers 2``, R=3): each rank
    reads its own share of the parts, the job's process only the table's listing and schema."""
    runs = []
    for size in sizes:
        folder = tmp / f"table-{size}"
        if not folder.exists():
            write_table(folder, size)
        job = run_job(str(folder), tmp / f"torch-{size}", env, None, ("--model", "torch", "--workers", "2"), 3)
        runs.append({"size": size, **job})
        print(json.dumps(runs[-1], default=str), flush=True)
    print()
    print("torch, 2 ranks on one machine: the job's process's peak RSS, its process tree's (the ranks, Prefect's "
          "temporary server), seconds per epoch, the best AUC")
    print(f"{'size MB':>8} {'job peak MB':>11} {'tree peak MB':>12} {'first result s':>14} {'wall s':>7} "
          f"{'s/epoch':>8} {'AUC':>7}")
    for r in runs:
        print(f"{r['size']:>8} {r['peak_mb']:>11.0f} {r['tree_peak_mb']:>12.0f} {r['first_s'] or float('nan'):>14.1f} "
              f"{r['wall_s']:>7.1f} {r['s_per_round']:>8.2f} {r['auc']:>7.4f}")
    if len(runs) > 1:
        print(f"the job's process's peak RSS at {runs[-1]['size']} MB is {runs[-1]['peak_mb'] / runs[0]['peak_mb']:.2f}x "
              f"its peak at {runs[0]['size']} MB (target: at most 1.15x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="table sizes in MB of float32, comma-separated")
    parser.add_argument("--storage", default="local,s3")
    parser.add_argument("--rounds-per-unit", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="10 and 40 MB, for a look")
    parser.add_argument("--one-machine", action="store_true",
                        help="no Dask: each size in memory and with --external-memory, beside a 5 MB table's run")
    parser.add_argument("--torch", action="store_true",
                        help="the torch model, 2 ranks on this machine, each reading its share (R=3)")
    args = parser.parse_args()
    sizes = [10, 40] if args.quick else [int(s) for s in args.sizes.split(",")]
    storages = args.storage.split(",")
    env = {**os.environ, "HYPERBAND_NO_LIVE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    if args.torch:
        with tempfile.TemporaryDirectory(prefix="bench-big-") as tmp:
            torch_ranks(Path(tmp), sizes, env)
        return
    if args.one_machine:
        with tempfile.TemporaryDirectory(prefix="bench-big-") as tmp:
            one_machine(Path(tmp), sizes, env, args.rounds_per_unit)
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-big-") as tmp:
        moto = None
        if "s3" in storages:
            port = free_port()
            moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_http(f"http://127.0.0.1:{port}/", "moto's S3 server")
            env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                       AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
            os.environ.update({k: env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                   "AWS_DEFAULT_REGION")})
        try:
            for size in sizes:
                folder = Path(tmp) / f"table-{size}"
                began = time.perf_counter()
                rows = write_table(folder, size)
                print(f"{size} MB: {rows:,} rows in {len(list(folder.glob('*.parquet')))} parts, written in "
                      f"{time.perf_counter() - began:.1f} s", flush=True)
                plain, fixed = anchor(folder)
                for storage in storages:
                    data = str(folder)
                    if storage == "s3":
                        import s3fs

                        fs = s3fs.S3FileSystem()
                        if not fs.exists("bench"):
                            fs.mkdir("bench")
                        fs.put(str(folder) + "/", f"bench/table-{size}/", recursive=True)
                        data = f"s3://bench/table-{size}/"
                    job = run_job(data, Path(tmp) / f"job-{size}-{storage}", env, args.rounds_per_unit)
                    results.append({"size": size, "storage": storage, "plain_s_per_round": plain,
                                    "plain_call_s": fixed, **job})
                    print(json.dumps(results[-1], default=str), flush=True)
        finally:
            if moto is not None:
                moto.kill()
    print()
    print("s/round: the job's training seconds per boosting round; plain: one long xgboost.dask call's; calls: the job's"
          " against plain calls of its trial-rungs' sizes (fixed seconds per call + rounds)")
    print(f"{'size':>6} {'storage':>7} {'peak RSS MB':>11} {'first result s':>14} {'reads per group (s)':>20} "
          f"{'s/round':>8} {'plain':>7} {'ratio':>6} {'calls':>6} {'AUC':>7}")
    for r in results:
        reads = ", ".join(f"{s:.1f}" for _, s in r["reads"])
        same_calls = r["trial_rungs"] * r["plain_call_s"] + r["rounds"] * r["plain_s_per_round"]
        print(f"{r['size']:>6} {r['storage']:>7} {r['peak_mb']:>11.0f} {r['first_s'] or float('nan'):>14.1f} "
              f"{reads:>20} {r['s_per_round']:>8.3f} {r['plain_s_per_round']:>7.3f} "
              f"{r['s_per_round'] / r['plain_s_per_round']:>6.2f} {r['train_s'] / same_calls:>6.2f} {r['auc']:>7.4f}")
    by = {(r["size"], r["storage"]): r for r in results}
    for storage in storages:
        small, large = by.get((sizes[0], storage)), by.get((sizes[-1], storage))
        if small and large and small is not large:
            print(f"{storage}: the job's process's peak RSS at {sizes[-1]} MB is {large['peak_mb'] / small['peak_mb']:.2f}x "
                  f"its peak at {sizes[0]} MB (target: at most 1.15x)")
    for size in sizes:
        if (size, "local") in by and (size, "s3") in by:
            print(f"{size} MB: AUC local {by[(size, 'local')]['auc']:.4f}, S3 {by[(size, 's3')]['auc']:.4f}")


if __name__ == "__main__":
    main()
