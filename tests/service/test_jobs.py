"""The job executor: idempotent claims, takeover of dead workers, bounded retries, cancellation,
shutdown, and artifacts that are complete or absent."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from app.core.db import utcnow
from app.core.files import sha256_hex
from app.galleries.models import Gallery
from app.jobs.models import UpgradeJob
from app.ml.methods.training import TrainingHooks
from app.models.models import TrainedModel
from app.upgrades import backbone
from app.upgrades.executor import Claim, execute
from app.upgrades.runner import JobRunner
from app.vectors.storage import storage_for
from tests.service.conftest import problem
from tests.service.test_upgrades_api import RecordingRunner, paired_setup, quick_upgrade


@pytest.fixture
def queued_job(client: TestClient) -> str:
    state = client.app.state.service
    real, state.runner = state.runner, RecordingRunner()
    _, dataset_id = paired_setup(client)
    job = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    assert job.status_code == 202, job.text
    yield job.json()["id"]
    state.runner = real


def job_row(client: TestClient, job_id: str) -> UpgradeJob:
    with client.app.state.service.db.sessions() as session:
        return session.get(UpgradeJob, job_id)


def set_job(client: TestClient, job_id: str, **values) -> None:
    with client.app.state.service.db.session() as session:
        session.execute(update(UpgradeJob).where(UpgradeJob.id == job_id).values(**values))


def run(client: TestClient, job_id: str, worker: str = "test:host:1:1", **kw) -> Claim:
    state = client.app.state.service
    return execute(state.db, state.settings, job_id, worker=worker, **kw)


def test_duplicate_delivery_runs_once(client: TestClient, queued_job: str) -> None:
    assert run(client, queued_job) is Claim.CLAIMED
    job = job_row(client, queued_job)
    assert job.status == "succeeded" and job.attempts == 1 and job.model_id
    assert run(client, queued_job, worker="test:other:2:2") is Claim.DONE
    state = client.app.state.service
    with state.db.sessions() as session:
        assert session.scalar(select(func.count()).select_from(TrainedModel)) == 1
        model = session.get(TrainedModel, job.model_id)
    artifact = state.settings.artifact_dir / model.artifact_path
    assert sha256_hex(artifact.read_bytes()) == model.artifact_sha256
    assert client.get(f"/v1/models/{model.id}").json()["artifact_sha256"] == model.artifact_sha256


def test_a_live_worker_keeps_its_job(client: TestClient, queued_job: str) -> None:
    set_job(client, queued_job, status="running", attempts=1, heartbeat_at=utcnow(), worker="w")
    assert run(client, queued_job) is Claim.BUSY
    assert job_row(client, queued_job).attempts == 1


def test_a_dead_workers_job_is_retried(client: TestClient, queued_job: str) -> None:
    stale = utcnow() - timedelta(hours=1)
    set_job(client, queued_job, status="running", attempts=1, heartbeat_at=stale, worker="dead")
    assert run(client, queued_job) is Claim.CLAIMED
    job = job_row(client, queued_job)
    assert job.status == "succeeded" and job.attempts == 2


def test_retries_are_bounded(client: TestClient, queued_job: str) -> None:
    limit = client.app.state.service.settings.job_max_attempts
    stale = utcnow() - timedelta(hours=1)
    set_job(client, queued_job, status="running", attempts=limit, heartbeat_at=stale, worker="dead")
    assert run(client, queued_job) is Claim.DONE
    job = job_row(client, queued_job)
    assert job.status == "failed" and "stopped responding" in job.error
    assert f"after {limit} attempts" in job.error


def test_sweep_resubmits_stale_and_lost_jobs(client: TestClient, queued_job: str) -> None:
    class Recorder(JobRunner):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            self.submitted: list[str] = []

        def submit(self, job_id: str) -> None:
            self.submitted.append(job_id)

    state = client.app.state.service
    runner = Recorder(state.db, state.settings)
    assert runner.sweep() == []  # queued just now: its message is still in flight
    set_job(client, queued_job, created_at=utcnow() - timedelta(hours=1))
    assert runner.sweep() == [queued_job]
    set_job(client, queued_job, status="running", heartbeat_at=utcnow() - timedelta(hours=1))
    assert runner.sweep() == [queued_job]
    runner.recover()
    assert runner.submitted == [queued_job, queued_job]  # recover() only resubmits queued jobs


def test_trainer_errors_fail_the_job_with_their_text(client: TestClient, queued_job: str) -> None:
    with client.app.state.service.db.session() as session:
        for gallery in session.scalars(select(Gallery)):
            storage = storage_for(session, gallery)
            stored = [i for part in storage.scan(session, gallery) for i in part.item_ids]
            storage.delete(session, gallery, stored)
    run(client, queued_job)
    job = client.get(f"/v1/upgrades/{queued_job}").json()
    assert job["status"] == "failed" and "too few" in job["error"]
    assert job["model_id"] is None


def slow_trainer(epochs: int, started: threading.Event):
    """A trainer double that only exercises the hooks: one epoch every 50 ms."""

    def train(method, data, gallery, *, params, seed, eval_fraction, hooks: TrainingHooks):
        for epoch in range(1, epochs + 1):
            hooks.check()
            time.sleep(0.05)
            hooks.report(epoch, epochs, 1.0 / epoch)
            started.set()
        raise AssertionError("the test expected the job to be stopped")

    return train


def test_cancel_stops_a_running_job(client: TestClient, queued_job: str, monkeypatch) -> None:
    started = threading.Event()
    monkeypatch.setattr(backbone, "train", slow_trainer(10_000, started))
    worker = threading.Thread(target=run, args=(client, queued_job))
    worker.start()
    assert started.wait(30)
    cancelled = client.post(f"/v1/upgrades/{queued_job}/cancel")
    assert cancelled.json()["cancel_requested"] is True
    worker.join(30)
    job = client.get(f"/v1/upgrades/{queued_job}").json()
    assert job["status"] == "cancelled" and job["progress"]["epoch"] < 10_000


def test_shutdown_requeues_without_spending_an_attempt(
    client: TestClient, queued_job: str, monkeypatch
) -> None:
    started, stop = threading.Event(), threading.Event()
    real_train = backbone.train
    monkeypatch.setattr(backbone, "train", slow_trainer(10_000, started))
    worker = threading.Thread(target=run, args=(client, queued_job), kwargs={"stop": stop})
    worker.start()
    assert started.wait(30)
    stop.set()
    worker.join(30)
    job = job_row(client, queued_job)
    assert job.status == "queued" and job.attempts == 0
    monkeypatch.setattr(backbone, "train", real_train)
    assert run(client, queued_job) is Claim.CLAIMED  # the next start picks it up again
    job = job_row(client, queued_job)
    assert job.status == "succeeded" and job.attempts == 1


def test_no_artifact_survives_a_lost_job(client: TestClient, queued_job: str) -> None:
    """If the job was taken over while training, the result is dropped with its file."""
    original = backbone.train

    def train_then_lose(*args, **kwargs):
        out = original(*args, **kwargs)
        set_job(client, queued_job, worker="someone-else")
        return out

    backbone.train = train_then_lose
    try:
        run(client, queued_job)
    finally:
        backbone.train = original
    state = client.app.state.service
    assert list(state.settings.artifact_dir.glob("*")) == []
    with state.db.sessions() as session:
        assert session.scalar(select(func.count()).select_from(TrainedModel)) == 0


def test_reports_and_progress_are_strict_json() -> None:
    import numpy as np

    from app.upgrades.executor import json_safe

    raw = {"loss": float("nan"), "best": np.float32(0.5), "per": [float("inf"), np.int64(3)]}
    assert json_safe(raw) == {"loss": None, "best": 0.5, "per": [None, 3]}


def test_a_job_whose_worker_is_gone_reads_stale_with_its_last_heartbeat(
    client: TestClient, queued_job: str
) -> None:
    """Issue 24, failure 7: a job whose worker died read "running" indefinitely, with nothing
    to tell it from a live one."""
    fresh = client.get(f"/v1/upgrades/{queued_job}").json()
    assert fresh["status"] == "queued" and fresh["stale"] is False
    set_job(client, queued_job, status="running", attempts=1, heartbeat_at=utcnow(), worker="w")
    live = client.get(f"/v1/upgrades/{queued_job}").json()
    assert live["stale"] is False and live["heartbeat_at"] is not None
    stale_after = client.app.state.service.settings.job_stale_after_s
    beat = utcnow() - timedelta(seconds=stale_after + 5)
    set_job(client, queued_job, status="running", attempts=1, heartbeat_at=beat, worker="dead")
    gone = client.get(f"/v1/upgrades/{queued_job}").json()
    assert gone["status"] == "running" and gone["stale"] is True
    listed = {j["id"]: j for j in client.get("/v1/upgrades").json()["items"]}
    assert listed[queued_job]["stale"] is True


def test_quotas_refuse_oversized_parameters_and_too_many_active_jobs(
    client: TestClient, queued_job: str
) -> None:
    """Issue 24, failure 3: 30 upgrades with epochs 10000, hidden_dim 65536 and
    min_batches_per_epoch 10000 were all accepted, and one tenant held the only worker."""
    settings = client.app.state.service.settings
    dataset_id = job_row(client, queued_job).dataset_id
    for name, setting in (
        ("epochs", "JOB_MAX_EPOCHS"),
        ("hidden_dim", "JOB_MAX_HIDDEN_DIM"),
        ("min_batches_per_epoch", "JOB_MAX_BATCHES_PER_EPOCH"),
    ):
        body = quick_upgrade(dataset_id, "contrastive")
        body["params"] = {**body["params"], name: 10**6}
        refused = problem(client.post("/v1/upgrades", json=body), 422)
        assert refused["errors"][0]["field"] == f"params.{name}"
        assert setting in refused["errors"][0]["message"]
    # One job is queued (the fixture's): fill the tenant's quota, then one more is refused.
    for _ in range(settings.max_active_jobs_per_tenant - 1):
        assert client.post("/v1/upgrades", json=quick_upgrade(dataset_id)).status_code == 202
    response = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    body = problem(response, 429)
    assert "NOBACKFILL_MAX_ACTIVE_JOBS_PER_TENANT" in body["detail"]
    assert response.headers["Retry-After"]
    # A finished job frees its place.
    set_job(client, queued_job, status="cancelled")
    assert client.post("/v1/upgrades", json=quick_upgrade(dataset_id)).status_code == 202


def test_a_job_past_its_time_limit_fails_saying_so(client: TestClient, queued_job: str) -> None:
    state = client.app.state.service
    limited = state.settings.model_copy(update={"job_max_seconds": 1e-6})
    assert execute(state.db, limited, queued_job, worker="test:host:1:1") is Claim.CLAIMED
    job = job_row(client, queued_job)
    assert job.status == "failed" and "NOBACKFILL_JOB_MAX_SECONDS" in job.error
    assert job.model_id is None


def test_cancel_stops_within_one_training_step() -> None:
    """The trainer used to look at the cancel flag once per epoch, and the tenant chooses how
    long an epoch is (cancel answered 200, the job ran on for 50 s)."""
    import numpy as np
    import torch

    from app.ml.geometry.space import EuclideanLift
    from app.ml.methods.compat import train_compatible_model
    from app.ml.methods.training import TrainingCancelled

    rng = np.random.default_rng(0)
    old = rng.normal(size=(256, 4)).astype(np.float32)
    new = rng.normal(size=(256, 6)).astype(np.float32)
    calls = {"stop": 0, "epochs": 0}

    def should_stop() -> bool:
        calls["stop"] += 1
        return calls["stop"] > 3

    hooks = TrainingHooks(
        progress=lambda _: calls.__setitem__("epochs", calls["epochs"] + 1),
        should_stop=should_stop,
    )
    params = {"epochs": 1, "min_batches_per_epoch": 64, "batch_size": 4}
    lift = EuclideanLift()
    points = lift(torch.as_tensor(old, dtype=torch.float64)).numpy()
    with pytest.raises(TrainingCancelled):
        train_compatible_model(
            "contrastive", new, points, None, lift.curv, params=params, hooks=hooks
        )
    # Stopped inside the first epoch, three steps in: no epoch was completed.
    assert calls["epochs"] == 0 and calls["stop"] == 4


@pytest.mark.faiss_only("the Celery runner with Milvus needs a Milvus server (none in tests)")
@pytest.mark.parametrize("broker", ["refusing", "silent"])
def test_creating_an_upgrade_while_the_broker_is_down_answers_at_once(
    make_client, broker: str
) -> None:
    """Issue 24, failure 7: POST /v1/upgrades blocked 25 s while Redis was down. ``silent``: a
    broker that accepts connections and never answers (a paused or wedged Redis)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # never accepted: connects complete, nothing is ever answered
    port = listener.getsockname()[1] if broker == "silent" else 1
    client = make_client(job_runner="celery", redis_url=f"redis://127.0.0.1:{port}/0")
    _, dataset_id = paired_setup(client)
    try:
        tic = time.monotonic()
        created = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
        elapsed = time.monotonic() - tic
    finally:
        listener.close()
    assert created.status_code == 202, created.text
    assert elapsed < 1.5, elapsed
    # Queued in the database: the sweeper sends it once the broker is back.
    assert job_row(client, created.json()["id"]).status == "queued"
