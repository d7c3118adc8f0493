"""What a job costs around its trials: `hyperband tune` end to end on a job with (nearly) no work, against the floor
of Prefect and MLflow themselves, measured in the same run.

* ``ours``: ``hyperband tune --model synthetic --mode asha --min-resource 1 --max-resource 1 --max-trials 4
  --concurrency 2 --no-baseline --json`` (4 trial-rungs of a closed-form curve), as a user runs it: a process,
  Prefect's temporary server (no ``PREFECT_API_URL``), MLflow in ``sqlite:///mlflow.db``.
* ``floor``: a script that does the least such a job must: imports Prefect and MLflow, runs one flow run on
  Prefect's own temporary server and, inside it, an MLflow parent run with one nested child run, one metric, both
  ended. The cost left when our code costs nothing.

Both run in one folder and one ``PREFECT_HOME``, each once beforehand (the stores' creation is not what is
measured), then in turns. Printed: the median seconds end to end, ours split into the job's own wall (the summary's
``wall_seconds``: its trials and their records) and the rest (the process, the server, the job's set-up and end),
and ours / floor.

Run from the repository root::

    python benchmarks/bench_startup.py            # 5 turns each (~2 min on 2 cores)
    python benchmarks/bench_startup.py --quick    # 2 turns each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import header, table  # noqa: E402

FLOOR = """
from mlflow import MlflowClient
from prefect import flow


@flow(name="floor")
def floor():
    client = MlflowClient("sqlite:///mlflow.db")
    found = client.get_experiment_by_name("floor")
    experiment = found.experiment_id if found else client.create_experiment("floor")
    parent = client.create_run(experiment).info.run_id
    child = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
    client.log_metric(child, "val_loss", 0.1, step=1)
    client.set_terminated(child)
    client.set_terminated(parent)


if __name__ == "__main__":
    floor()
"""

OURS = ["-m", "prefect_hyperband.app.cli", "tune", "--model", "synthetic", "--mode", "asha", "--min-resource", "1",
        "--max-resource", "1", "--max-trials", "4", "--concurrency", "2", "--no-baseline", "--json"]


def timed(argv: list[str], where: Path, env: dict[str, str]) -> tuple[float, str]:
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=where, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=5, help="measured runs of each (after one unmeasured)")
    ap.add_argument("--quick", action="store_true", help="2 turns each (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.turns = 2
    header("start-up: hyperband tune on 4 instant trial-rungs, end to end, against Prefect + MLflow's floor")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        where = Path(tmp)
        (where / "floor.py").write_text(FLOOR)
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
        env.update(PREFECT_HOME=str(where / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
                   HYPERBAND_NO_LIVE="1")
        timed(OURS, where, env)  # the stores made, not measured
        timed(["floor.py"], where, env)
        ours, flows, floor = [], [], []
        for _ in range(args.turns):
            wall, out = timed(OURS, where, env)
            ours.append(wall)
            flows.append(json.loads(out.strip().splitlines()[-1])["summary"]["wall_seconds"])
            floor.append(timed(["floor.py"], where, env)[0])
    o, f, fl = statistics.median(ours), statistics.median(flows), statistics.median(floor)
    print(table([[f"{o:.2f}", f"{f:.2f}", f"{o - f:.2f}", f"{fl:.2f}", f"{o / fl:.2f}x"]],
                ["ours end to end (s)", "its trials (summary wall, s)", "the rest (s)", "floor (s)", "ours / floor"]))
    print(f"medians of {args.turns} turns; ours {min(ours):.2f}-{max(ours):.2f} s, floor {min(floor):.2f}-{max(floor):.2f} s")
    print(json.dumps({"ours": ours, "ours_trials": flows, "floor": floor}))


if __name__ == "__main__":
    main()
