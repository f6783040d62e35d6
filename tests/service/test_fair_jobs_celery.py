"""Fair job queues on real Celery workers (issue 45 item 5; PostgreSQL + Redis, the compose
mode): a message no longer decides which job runs, the fair order does, and a job passed over
because its tenant ran its most is started by the message its tenant's finished job sends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.auth.service import create_key
from app.core.db import as_utc
from app.jobs.models import UpgradeJob
from tests.service.celery_worker import celery_overrides, celery_worker, require_redis
from tests.service.conftest import wait_until
from tests.service.test_fair_jobs import as_tenant
from tests.service.test_upgrades_api import paired_setup, quick_upgrade

# Longer than the test needs it (minutes on a loaded 2-core machine); the test cancels it.
LONG = {"epochs": 1000, "hidden_dim": 16}


@pytest.fixture(params=["postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    """Workers are other processes on the compose mode's database."""
    return request.param


def post(client: TestClient, dataset_id: str, key: str | None = None, **params) -> str:
    body = quick_upgrade(dataset_id, "hbct" if params else "procrustes")
    body["params"] = {**body["params"], **params}
    if key is None:
        created = client.post("/v1/upgrades", json=body)
    else:
        with as_tenant(client, key):
            created = client.post("/v1/upgrades", json=body)
    assert created.status_code == 202, created.text
    return created.json()["id"]


def two_tenants(client: TestClient) -> tuple[str, str, str]:
    """(A's dataset, B's key, B's dataset); A is the client's own tenant."""
    with client.app.state.service.db.session() as session:
        b_key = create_key(session, "tenant-b").key
    _, a_dataset = paired_setup(client, name="a")
    with as_tenant(client, b_key):
        _, b_dataset = paired_setup(client, name="b")
    return a_dataset, b_key, b_dataset


def rows(client: TestClient, job_ids: list[str]) -> dict[str, UpgradeJob]:
    with client.app.state.service.db.sessions() as session:
        return {job_id: session.get(UpgradeJob, job_id) for job_id in job_ids}


def all_succeeded(client: TestClient, job_ids: list[str], timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        found = rows(client, job_ids)
        if all(r.status == "succeeded" for r in found.values()):
            return found
        ended = [r for r in found.values() if r.status in ("failed", "cancelled")]
        states = [(r.id, r.status, r.attempts, r.progress, r.error) for r in found.values()]
        assert not ended and time.monotonic() < deadline, states
        time.sleep(0.2)


def ready(log: Path) -> bool:
    return log.exists() and " ready." in log.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.faiss_only("the Celery runner with Milvus needs a Milvus server (none in tests)")
def test_a_worker_runs_the_fair_job_not_the_next_message(
    make_client, make_settings, tmp_path: Path
) -> None:
    """A's three messages were in the queue before B's: a worker ran them first (FIFO)."""
    require_redis()
    overrides = celery_overrides()
    client = make_client(**overrides)
    a_dataset, b_key, b_dataset = two_tenants(client)
    a = [post(client, a_dataset) for _ in range(3)]
    b = post(client, b_dataset, b_key)
    with celery_worker(make_settings(**overrides), tmp_path / "worker.log"):
        found = all_succeeded(client, [*a, b], timeout=240)
    order = sorted(found, key=lambda job_id: as_utc(found[job_id].started_at))
    assert order == [a[0], b, a[1], a[2]]


@pytest.mark.slow
@pytest.mark.faiss_only("the Celery runner with Milvus needs a Milvus server (none in tests)")
def test_another_tenants_job_takes_the_second_worker_at_once(
    make_client, make_settings, tmp_path: Path
) -> None:
    """Two workers, one running job per tenant: A's second job is passed over while its first
    trains, B's job runs on the other worker meanwhile, and A's second starts as soon as its
    first ends (by the message the finishing worker sends: no message of its own is left, and
    the sweeper would resend one only after 120 s)."""
    require_redis()
    overrides = celery_overrides()
    client = make_client(**overrides)
    a_dataset, b_key, b_dataset = two_tenants(client)
    settings = make_settings(**overrides)
    logs = [tmp_path / "worker-1.log", tmp_path / "worker-2.log"]
    with celery_worker(settings, logs[0]), celery_worker(settings, logs[1]):
        wait_until(lambda: all(ready(log) for log in logs), 120, "both workers to start")
        long_a = post(client, a_dataset, **LONG)
        queued_a = post(client, a_dataset)
        tic = time.monotonic()
        b = post(client, b_dataset, b_key)
        all_succeeded(client, [b], timeout=60)
        waited = time.monotonic() - tic
        during = rows(client, [long_a, queued_a])
        # A's long job has done its part; cancelled, it ends within one step.
        assert client.post(f"/v1/upgrades/{long_a}/cancel").status_code == 200
        found = all_succeeded(client, [queued_a], timeout=120)
        ended = rows(client, [long_a])[long_a]
    assert during[long_a].status == "running", (waited, during[long_a].status)
    assert during[queued_a].status == "queued"
    assert ended.status == "cancelled"
    gap = as_utc(found[queued_a].started_at) - as_utc(ended.finished_at)
    assert gap.total_seconds() < 10, gap
