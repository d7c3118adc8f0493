"""``hyperband scale``: one job per cluster size nested under one study run, the transferred config scored."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_scale_prints_the_table_and_nests_the_jobs_under_one_study_run(tracking_uri, tmp_path, capsys):
    from mlflow import MlflowClient

    from prefect_hyperband.app import cli
    from prefect_hyperband.trainers.synthetic_trainer import SyntheticTrainer

    code = cli.main(["scale", "--model", "synthetic", "--workers", "1,2", "--max-resource", "3", "--seed", "3",
                     "--no-baseline", "--job-dir", str(tmp_path / "jobs"), "--experiment", "study", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["workers"] for r in result["rows"]] == [1, 2]
    assert set(result["rows"][0]) == {"workers", "tuned_score", "transferred_score", "worker_seconds", "wall_seconds",
                                      "time_to_target"}
    assert result["cheapest"] in (1, 2) and result["fastest"] in (1, 2)

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name("study")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    by_parent: dict[str | None, list] = {}
    for r in runs:
        by_parent.setdefault(r.data.tags.get("mlflow.parentRunId"), []).append(r)
    (study,) = by_parent[None]  # one top-level run: the study
    assert study.info.run_id == result["study_run_id"] and study.info.status == "FINISHED"
    under = {r.info.run_name: r for r in by_parent[study.info.run_id]}
    jobs = [r for name, r in under.items() if name.startswith("hyperband-")]
    transfers = [r for name, r in under.items() if name.startswith("transfer")]
    assert len(jobs) == 2 and len(transfers) == 2
    for job in jobs:  # each size's job keeps its trial runs under its own parent run
        assert len(by_parent[job.info.run_id]) == 5  # (1, 3, 3): 5 configs
    artifacts = {a.path for a in client.list_artifacts(study.info.run_id)}
    assert {"scaling.json", "scaling.txt", "scaling.png"} <= artifacts

    # the transferred score is the config tuned at 1 worker, trained to R from scratch at N and evaluated
    saved = json.loads(open(client.download_artifacts(study.info.run_id, "scaling.json", str(tmp_path))).read())
    best = saved["best_config"]
    curve = SyntheticTrainer(seed=3)
    expected = curve.curve(curve.resolve(best), 3)
    assert all(r["transferred_score"] == pytest.approx(expected) for r in result["rows"])
    for t in transfers:
        assert {k: t.data.params[k] for k in best} == {k: str(v) if not isinstance(v, float) else f"{v:.6g}" for k, v in best.items()}


def test_scale_refuses_a_size_the_machine_cannot_hold_before_any_work(tracking_uri, tmp_path, capsys):
    import os

    from prefect_hyperband.app import cli

    too_many = (os.cpu_count() or 1) + 1
    code = cli.main(["scale", "--model", "xgboost", "--workers", f"1,{too_many}", "--max-resource", "3",
                     "--job-dir", str(tmp_path / "jobs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [line for line in err.splitlines() if line.startswith("hyperband: error: ")]
    assert f"--workers {too_many} starts {too_many} local worker processes" in err, err
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").rglob("state.json"))


def test_a_study_whose_mlflow_does_not_answer_stops_in_one_line_within_its_service_wait(tmp_path, capsys):
    """MLflow answers the preflight's health check, then 503 to every write (a server whose database is gone): the
    study's first write waits --service-wait, as a job's do, and the study stops in one line, exit 75."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prefect_hyperband.app import cli

    class Unavailable(BaseHTTPRequestHandler):
        def _answer(self):
            healthy = self.path.startswith("/health")
            self.send_response(200 if healthy else 503)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK" if healthy else b"no")

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    began = time.monotonic()
    try:
        code = cli.main(["scale", "--model", "synthetic", "--workers", "1,2", "--max-resource", "3", "--no-baseline",
                         "--job-dir", str(tmp_path / "jobs"), "--tracking-uri", uri, "--service-wait", "3"])
    finally:
        server.shutdown()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 75, err
    assert time.monotonic() - began < 60
    assert [line for line in err if line.startswith("hyperband: ")] == err[-1:], err
    assert err[-1].startswith("hyperband: scaling study ") and \
        f"stopped: MLflow did not answer within 3 s (--service-wait) while its runs were written to MLflow at {uri}: " in err[-1], err
    assert "Traceback" not in "\n".join(err)


def test_a_study_whose_prefect_api_does_not_answer_names_prefect_not_mlflow(monkeypatch, tmp_path):
    """The same words as a job's end (``record.outage``): an error of Prefect's client is Prefect's API's."""
    import httpx

    from prefect_hyperband.flows import scale as study
    from prefect_hyperband.flows.params import TuneParams
    from prefect_hyperband.tasks import record

    def cut(*args, **kwargs):
        raise httpx.ConnectError("All connection attempts failed")

    monkeypatch.setattr(study, "_study", cut)
    monkeypatch.setattr(record, "prefect_api", lambda: "http://127.0.0.1:4299/api")
    state = study.scale.fn(TuneParams(model="synthetic", job_id="s1", tracking_uri="sqlite:///x.db", service_wait=5),
                           [1, 2])
    assert state.is_cancelled()
    assert state.message == ("scaling study s1 stopped: Prefect's API did not answer while its runs were written "
                             "through Prefect's API at http://127.0.0.1:4299/api: All connection attempts failed; the "
                             "jobs finished so far keep their runs, run the study again")
