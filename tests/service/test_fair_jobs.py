"""Fair job queues (issue 45, item 5): one tenant's queue of long jobs must not starve another
tenant's upgrades. The next free slot goes to the tenant with the fewest running jobs and the
oldest last start (round-robin across tenants), a tenant runs at most
``max_running_jobs_per_tenant`` jobs at once, and its queued and running jobs may hold at most
``max_queued_job_steps_per_tenant`` estimated training steps."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.auth.service import create_key
from app.core.db import as_utc, utcnow
from app.core.settings import Settings
from app.jobs.models import UpgradeJob
from app.upgrades import backbone
from app.upgrades.executor import Claim, claim, execute, fair_order, run_next
from tests.service.conftest import problem, wait_until
from tests.service.test_upgrades_api import RecordingRunner, paired_setup, quick_upgrade

SCHEDULING = "scheduling reads and writes job rows only; the vector engine plays no part"


@contextmanager
def as_tenant(client: TestClient, key: str) -> Iterator[None]:
    """Requests made inside run as the tenant of ``key``."""
    own = client.headers["Authorization"]
    client.headers["Authorization"] = f"Bearer {key}"
    try:
        yield
    finally:
        client.headers["Authorization"] = own


def job_row(client: TestClient, job_id: str) -> UpgradeJob:
    with client.app.state.service.db.sessions() as session:
        return session.get(UpgradeJob, job_id)


def set_job(client: TestClient, job_id: str, **values) -> None:
    with client.app.state.service.db.session() as session:
        session.execute(update(UpgradeJob).where(UpgradeJob.id == job_id).values(**values))


class TwoTenants:
    """Tenant A (the client's own key) floods the queue; tenant B posts one quick job. A's
    trainings wait at a gate until the test opens it, so that A's first job is certainly still
    running while the rest are queued."""

    def __init__(self, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.client = client
        with client.app.state.service.db.session() as session:
            self.b_key = create_key(session, "tenant-b").key
        a_gallery, self.a_dataset = paired_setup(client, name="a")
        with as_tenant(client, self.b_key):
            _, self.b_dataset = paired_setup(client, name="b")
        self.gate, self.entered = threading.Event(), threading.Event()
        real_train = backbone.train

        def gated(method, data, gallery, **kwargs):
            if gallery.id == a_gallery:
                self.entered.set()
                assert self.gate.wait(60), "the test never opened the gate"
            return real_train(method, data, gallery, **kwargs)

        monkeypatch.setattr(backbone, "train", gated)

    def post_a(self) -> str:
        created = self.client.post("/v1/upgrades", json=quick_upgrade(self.a_dataset))
        assert created.status_code == 202, created.text
        return created.json()["id"]

    def post_b(self) -> str:
        with as_tenant(self.client, self.b_key):
            created = self.client.post("/v1/upgrades", json=quick_upgrade(self.b_dataset))
        assert created.status_code == 202, created.text
        return created.json()["id"]

    def finished(self, job_ids: list[str], timeout: float = 60) -> dict[str, UpgradeJob]:
        def done() -> dict[str, UpgradeJob] | None:
            rows = {job_id: job_row(self.client, job_id) for job_id in job_ids}
            return rows if all(r.status == "succeeded" for r in rows.values()) else None

        return wait_until(done, timeout, f"jobs {job_ids} to succeed")


@pytest.mark.faiss_only(SCHEDULING)
def test_another_tenants_job_starts_before_the_flooders_next_one(
    make_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45 item 5: with one slot, tenant B's job waited behind every job tenant A had
    queued (FIFO). Now the slot goes round-robin: B's job is the next one after A's running one,
    and A's own jobs keep their order."""
    client = make_client(job_runner="thread", job_threads=1)
    tenants = TwoTenants(client, monkeypatch)
    a = [tenants.post_a()]
    assert tenants.entered.wait(30)
    a += [tenants.post_a(), tenants.post_a()]
    b = tenants.post_b()
    tenants.gate.set()
    rows = tenants.finished([*a, b])
    order = sorted(rows, key=lambda job_id: as_utc(rows[job_id].started_at))
    assert order == [a[0], b, a[1], a[2]]


@pytest.mark.faiss_only(SCHEDULING)
def test_a_tenant_runs_at_most_its_cap_and_another_starts_within_seconds(
    make_client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slots, the default cap of one running job per tenant: A's second job stays queued
    while its first runs, so B's job takes the free slot at once instead of waiting behind A."""
    client = make_client(job_runner="thread", job_threads=2)
    assert client.app.state.service.settings.max_running_jobs_per_tenant == 1
    tenants = TwoTenants(client, monkeypatch)
    a = [tenants.post_a()]
    assert tenants.entered.wait(30)
    a.append(tenants.post_a())
    b = tenants.post_b()
    done = tenants.finished([b], timeout=20)[b]
    waited = (as_utc(done.started_at) - as_utc(done.created_at)).total_seconds()
    assert waited < 5, waited
    assert job_row(client, a[0]).status == "running"
    assert job_row(client, a[1]).status == "queued"  # A holds one slot, the other stayed free
    tenants.gate.set()
    rows = tenants.finished(a)
    assert rows[a[1]].attempts == 1


def queued_jobs(client: TestClient, n: int) -> list[str]:
    """``n`` jobs of the client's tenant, left queued (no runner)."""
    state = client.app.state.service
    real, state.runner = state.runner, RecordingRunner()
    try:
        _, dataset_id = paired_setup(client)
        created = [client.post("/v1/upgrades", json=quick_upgrade(dataset_id)) for _ in range(n)]
    finally:
        state.runner = real
    assert all(c.status_code == 202 for c in created), [c.text for c in created]
    return [c.json()["id"] for c in created]


@pytest.mark.faiss_only(SCHEDULING)
def test_a_claim_beyond_the_running_cap_leaves_the_job_queued(client: TestClient) -> None:
    """The cap is checked in the claim's conditional UPDATE, so no transport (thread, Celery, a
    duplicate message) can start a job of a tenant that already runs its most."""
    first, second = queued_jobs(client, 2)
    set_job(client, first, status="running", attempts=1, heartbeat_at=utcnow(), worker="w")
    state = client.app.state.service
    assert execute(state.db, state.settings, second, worker="test:1:1:1") is Claim.WAITING
    assert job_row(client, second).status == "queued" and job_row(client, second).attempts == 0
    # A dead worker's job is taken over even though it counts as running (it is its own slot).
    set_job(client, first, heartbeat_at=utcnow() - timedelta(hours=1))
    assert execute(state.db, state.settings, first, worker="test:1:1:1") is Claim.CLAIMED
    assert job_row(client, first).status == "succeeded"
    assert run_next(state.db, state.settings, worker="test:1:1:1") is Claim.CLAIMED
    assert job_row(client, second).status == "succeeded"
    assert run_next(state.db, state.settings, worker="test:1:1:1") is Claim.DONE


@pytest.mark.faiss_only(SCHEDULING)
def test_concurrent_claims_never_exceed_the_cap(client: TestClient) -> None:
    """Slots claiming at the same instant (several worker processes): each claim counts the
    tenant's running jobs in its own UPDATE, after the claims it waited for committed."""
    jobs = queued_jobs(client, 4)
    state = client.app.state.service
    barrier = threading.Barrier(len(jobs))
    outcomes: dict[str, Claim] = {}

    def claim_one(job_id: str) -> None:
        barrier.wait()
        outcomes[job_id] = claim(state.db, state.settings, job_id, f"test:{job_id}:1:1")

    threads = [threading.Thread(target=claim_one, args=(job_id,)) for job_id in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(o.value for o in outcomes.values()) == ["claimed"] + ["waiting"] * 3
    assert sum(job_row(client, job_id).status == "running" for job_id in jobs) == 1


@pytest.mark.faiss_only(SCHEDULING)
def test_the_fair_order_goes_round_robin_across_tenants(client: TestClient) -> None:
    """The tenant with the fewest running jobs first, then the one whose last start is oldest,
    then the oldest job: whatever order the jobs were queued in."""
    a1, a2 = queued_jobs(client, 2)
    with client.app.state.service.db.session() as session:
        b_key = create_key(session, "tenant-b").key
    with as_tenant(client, b_key):
        (b1,) = queued_jobs(client, 1)
    state = client.app.state.service
    with state.db.sessions() as session:
        assert fair_order(session, state.settings) == [a1, a2, b1]  # nobody started: FIFO
    set_job(client, a1, status="succeeded", started_at=utcnow())
    with state.db.sessions() as session:
        assert fair_order(session, state.settings) == [b1, a2]  # A went last
    set_job(client, b1, status="running", heartbeat_at=utcnow(), started_at=utcnow())
    with state.db.sessions() as session:
        assert fair_order(session, state.settings) == [a2]  # B runs its most: not a candidate


def test_the_default_time_limit_is_two_hours() -> None:
    """Issue 45 item 5: with 6 h a tenant's four jobs could hold a slot for about a day."""
    assert Settings(_env_file=None).job_max_seconds == 2 * 3600


@pytest.mark.faiss_only(SCHEDULING)
def test_queued_training_steps_are_capped_per_tenant(make_client) -> None:
    """An estimate of each job's optimiser steps (epochs × batches per epoch, per model it
    trains) is summed over the tenant's queued and running jobs: 429 with Retry-After above
    the setting; a single job above it can never fit, 422."""
    # 60 paired items, 48 of them trained on: contrastive with min_batches_per_epoch 8 takes
    # batches of 6, 8 a epoch, for the model and the independent reference (labels: 2 models).
    per_job = 2 * 100 * 8
    client = make_client(max_queued_job_steps_per_tenant=int(1.5 * per_job))
    state = client.app.state.service
    real, state.runner = state.runner, RecordingRunner()
    try:
        _, dataset_id = paired_setup(client)
        body = quick_upgrade(dataset_id, "contrastive")
        body["params"] = {**body["params"], "epochs": 100}
        first = client.post("/v1/upgrades", json=body)
        assert first.status_code == 202, first.text
        refused = client.post("/v1/upgrades", json=body)
        detail = problem(refused, 429)["detail"]
        assert "NOBACKFILL_MAX_QUEUED_JOB_STEPS_PER_TENANT" in detail and f"{per_job:,}" in detail
        assert refused.headers["Retry-After"]
        huge = {**body, "params": {**body["params"], "epochs": 1000}}
        too_big = problem(client.post("/v1/upgrades", json=huge), 422)
        assert too_big["errors"][0]["field"] == "params"
        assert "NOBACKFILL_MAX_QUEUED_JOB_STEPS_PER_TENANT" in too_big["errors"][0]["message"]
        # Procrustes is closed form; its only optimiser steps are the reference's 2 epochs.
        assert client.post("/v1/upgrades", json=quick_upgrade(dataset_id)).status_code == 202
        # A finished job frees its steps.
        set_job(client, first.json()["id"], status="succeeded")
        assert client.post("/v1/upgrades", json=body).status_code == 202
    finally:
        state.runner = real
