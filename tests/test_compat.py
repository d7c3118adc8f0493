"""Issue 75: the package installs next to what users have. On Python 3.12 and 3.13 (this machine's pyenv), a fresh
virtual environment takes the package without torch and with the newest versions its ranges allow (no
constraints file), and runs a short XGBoost job and a job of the user's own function end to end; ``--model torch``
there ends in one line naming the extra."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: one XGBoost job and one of the bundled user function (R=3, eta 3: 5 configs, 6 trial-rungs each)
JOBS = {
    "xgboost": (["--max-resource", "3", "--eta", "3", "--seed", "1", "--no-baseline"], 6),
    "function": (["--trainer", str(ROOT / "examples" / "sklearn_sgd.py") + ":train", "--space",
                  str(ROOT / "examples" / "sklearn_space.yaml"), "--metric", "val_loss", "--direction", "minimize",
                  "--max-resource", "3", "--eta", "3", "--seed", "1", "--no-baseline"], 6),
}
#: the child runs of a job's parent run, counted by that environment's own MLflow
COUNT = """
import sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                          f"tags.mlflow.parentRunId = '{sys.argv[2]}'", max_results=1000)
print(len(runs))
"""


def interpreter(version: str) -> str:
    """This machine's Python ``version`` (pyenv's, or on the PATH): the check runs on every supported Python."""
    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python{version}")) or \
        [p for p in [shutil.which(f"python{version}")] if p]
    assert found, f"no Python {version} here (pyenv's /root/.pyenv/versions/{version}.*, or python{version} on PATH)"
    return found[-1]


def install(version: str, root: Path) -> Path:
    venv = root / f"py{version}"
    subprocess.run([interpreter(version), "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(ROOT)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def run(venv: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "PYTHON"))}
    env.update(PREFECT_HOME=str(cwd / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false", HYPERBAND_NO_LIVE="1")
    return subprocess.run([str(venv / "bin" / "hyperband"), "tune", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def test_python_3_12_and_3_13_install_without_torch_at_the_newest_versions_and_run_jobs(tmp_path: Path):
    with ThreadPoolExecutor(2) as pool:  # the two installs at once: mostly downloads and unpacking
        venvs = dict(zip(("3.12", "3.13"), pool.map(lambda v: install(v, tmp_path), ("3.12", "3.13"))))
    for version, venv in venvs.items():
        python = str(venv / "bin" / "python")
        assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0, "torch installed"
        versions = subprocess.run([python, "-c", "import prefect, xgboost, sys; print(sys.version.split()[0], "
                                   "prefect.__version__, xgboost.__version__)"], capture_output=True, text=True)
        print(f"Python {version}: Python, prefect, xgboost = {versions.stdout.strip()}")
        for name, (argv, trial_rungs) in JOBS.items():
            cwd = tmp_path / f"{version}-{name}"
            cwd.mkdir()
            done = run(venv, cwd, *argv, "--json")
            assert done.returncode == 0, (version, name, done.stderr[-3000:])
            result = json.loads(done.stdout)  # one document, whole
            assert result["summary"]["trial_rungs"] == trial_rungs and result["summary"]["failed_trials"] == 0
            assert result["summary"]["best_score"] is not None, (version, name)
            counted = subprocess.run([python, "-c", COUNT, f"sqlite:///{cwd / 'mlflow.db'}", result["parent_run_id"]],
                                     capture_output=True, text=True, cwd=cwd)
            configs = result["summary"]["configs"]
            assert counted.stdout.strip() == str(configs), (version, name, counted.stdout, counted.stderr[-2000:])
        refused = run(venv, tmp_path, "--model", "torch", "--data", "digits")
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr.strip().splitlines() == [
            "hyperband: error: --model torch needs torch, which is not installed here: pip install "
            "'prefect-hyperband[torch]' (or install your own torch build first, a CUDA one on GPU machines)"]
