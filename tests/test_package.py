"""The distribution: one import package, the bundled data inside the wheel, at home beside a user's own
``flows/`` and ``tasks.py``; the wheel is built, installed into a fresh venv (its dependencies found in the test
run's environment, then checked by ``pip check``) and run end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_version_matches_the_metadata():
    import prefect_hyperband

    assert prefect_hyperband.__version__ == VERSION


def test_bundled_data_is_package_data():
    from importlib import resources

    from prefect_hyperband.trainers.data import BANK_MARKETING, DataSpec, load

    assert resources.files("prefect_hyperband.data").joinpath(*BANK_MARKETING).is_file()
    ds = load(DataSpec("bank-marketing"))
    assert "duration" not in ds.feature_names and len(ds.y_train) + len(ds.y_val) == 41188


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs_the_default_job_beside_a_users_project(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_HOME=str(tmp_path / "prefect-home"),
               PIP_DISABLE_PIP_VERSION_CHECK="1")

    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)], tmp_path, env)
    (wheel,) = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"prefect_hyperband", f"prefect_hyperband-{VERSION}.dist-info"}, tops
    assert "prefect_hyperband/data/bank-marketing/bank-additional-full.csv.gz" in names
    assert "prefect_hyperband/deployments/prefect.yaml" in names
    top_level = zipfile.ZipFile(wheel).read(f"prefect_hyperband-{VERSION}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in top_level and "Requires-Python: >=3.11" in top_level

    # a fresh venv that finds the wheel's dependencies in this test run's environment (a path in a .pth file: its
    # packages, not its editable install of this project, whose hook is a .pth of its own and is not read from
    # there). Installing them again from the index took 4 to 5 of this test's 6 minutes on 2 cores and checks
    # nothing of the wheel: `.ci/run` resolves the same metadata from scratch for the editable install
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    python, bin_ = str(venv / "bin" / "python"), venv / "bin"
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env).stdout.strip()
    Path(site, "test-run-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], tmp_path, env)  # venv's old one hid torch's
    # the wheel itself into the venv (the same version is installed, editable, in the test run's environment: pip
    # would take it as already there), then every requirement it declares checked as met
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], tmp_path, env)
    assert list(Path(site).glob(f"prefect_hyperband-{VERSION}.dist-info")), "the wheel is not installed in the venv"
    _run([python, "-m", "pip", "check"], tmp_path, env)

    # a user's project: its own `flows` package and `tasks.py` first on sys.path, as in a notebook
    project = tmp_path / "project"
    (project / "flows").mkdir(parents=True)
    (project / "flows" / "__init__.py").write_text("raise ImportError('the user flows package must not be imported')\n")
    (project / "tasks.py").write_text("raise ImportError('the user tasks module must not be imported')\n")
    probe = _run([str(bin_ / "python"), "-c", "import prefect_hyperband as hb, prefect_hyperband.flows.tune; print(hb.__version__, hb.__file__)"],
                 project, env)
    version, location = probe.stdout.split()
    assert version == VERSION and location.startswith(str(venv)), probe.stdout

    plan = _run([str(bin_ / "hyperband"), "plan", "--max-resource", "3"], project, env)
    assert "5 configs, 6 trial-rungs" in plan.stdout

    job = _run([str(bin_ / "hyperband"), "tune", "--max-resource", "3", "--no-baseline", "--no-register-model", "--job-id", "wheel"],
               project, env)
    assert "6 trial-rungs, 3 reached R=3, 0 failed" in job.stdout, job.stdout
    assert "MLflow: experiment 'hyperband'" in job.stdout
    assert (project / "mlflow.db").is_file() and (project / "hyperband-jobs" / "wheel").is_dir()
    assert "Traceback" not in job.stderr, job.stderr[-3000:]
