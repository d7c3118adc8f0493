"""A job's search space: the torch model's GPU-sized default where its trials have GPUs (issue 76), kept on resume."""

from __future__ import annotations

from prefect_hyperband.flows.params import TuneParams


def test_a_torch_job_with_gpus_takes_the_gpu_sized_default_space_and_a_resume_elsewhere_keeps_its_own(
        tmp_path, monkeypatch, tracking_uri):
    """``--gpus 0`` (placement is checked on this CPU machine: the ids a trial is given): batches of 128-1024 and widths
    of 64-512; ``--device cpu`` the CPU-sized default. The job's record keeps the space it began with, so a resume on a
    machine without a GPU samples the same configs (before: a resume took the space of the machine it ran on)."""
    from prefect_hyperband.executors.state import save_job_record
    from prefect_hyperband.flows import parents
    from prefect_hyperband.flows.prepare import prepare, resume_params
    from prefect_hyperband.flows.search_space import job_space
    from prefect_hyperband.trainers import registry

    common = dict(model="torch", data="digits", max_resource=3, job_dir=str(tmp_path))
    params = TuneParams(**common, gpus="0", job_id="on-gpu")
    job = prepare(params)
    assert job.space["batch_size"]["choices"] == [128, 256, 512, 1024]
    assert (job.space["width"]["low"], job.space["width"]["high"]) == (64, 512)
    on_cpu = prepare(TuneParams(**common, device="cpu", job_id="on-cpu"))
    assert on_cpu.space["batch_size"]["choices"] == [16, 32, 64]
    save_job_record(job, params.model_dump(mode="json"), parents.facts(job, params))

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # resumed where there is no GPU
    again = resume_params(str(tmp_path), "on-gpu")
    space, _ = job_space(again, registry.get("torch"), on_gpu=False)
    assert space.to_dict() == job.space
    mine = resume_params(str(tmp_path), "on-gpu", {"space": None})  # (nothing given: the saved one still)
    assert mine.space == job.space
