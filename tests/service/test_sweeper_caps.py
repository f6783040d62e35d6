"""The job sweeper and the per-tenant running cap (issue 45 item 5). The sweeper sends again the
jobs whose message may be lost; a job held back by its tenant's cap has no lost message, it
waits for its tenant's running job. Sending it on every sweep defeated nothing (a claim checks
the cap, a duplicate claim runs nothing) but piled one no-op message per waiting job into the
broker every sweep for as long as the tenant's job ran (2 h by default). And on Celery the
sweeper tops the queue up to one message per startable job instead of adding to it while every
worker is busy."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from fastapi.testclient import TestClient

from app.auth.service import create_key
from app.core.db import utcnow
from app.upgrades.executor import Claim, run_next
from app.upgrades.runner import JobRunner
from tests.service.celery_worker import celery_overrides, require_redis
from tests.service.test_fair_jobs import (
    SCHEDULING,
    as_tenant,
    job_row,
    queued_jobs,
    set_job,
)

LONG_AGO = timedelta(hours=1)  # past every stale time: a sweep considers the job's message lost


class Recorder(JobRunner):
    """The sweeper's sends, recorded; a send may also be delivered like a Celery message."""

    def __init__(self, *args: object, deliver: bool = False) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.submitted: list[str] = []
        self.deliver = deliver

    def submit(self, job_id: str) -> None:
        self.submitted.append(job_id)
        if self.deliver:
            run_next(self.db, self.settings, worker="celery:test:1:1", hint=job_id)


def flooded(client: TestClient) -> tuple[str, list[str]]:
    """Tenant A: one job running (a live worker), three queued behind the cap, all old."""
    running, *waiting = queued_jobs(client, 4)
    for job_id in [running, *waiting]:
        set_job(client, job_id, created_at=utcnow() - LONG_AGO)
    set_job(client, running, status="running", attempts=1, heartbeat_at=utcnow(), worker="w")
    return running, waiting


@pytest.mark.faiss_only(SCHEDULING)
def test_the_sweeper_sends_nothing_for_jobs_held_back_by_their_tenants_cap(
    client: TestClient,
) -> None:
    state = client.app.state.service
    assert state.settings.max_running_jobs_per_tenant == 1
    running, waiting = flooded(client)
    runner = Recorder(state.db, state.settings)
    for _ in range(10):
        assert runner.sweep() == []
    assert runner.submitted == []
    # Another tenant's job with a lost message is startable: sent at once.
    with client.app.state.service.db.session() as session:
        b_key = create_key(session, "tenant-b").key
    with as_tenant(client, b_key):
        (b_job,) = queued_jobs(client, 1)
    set_job(client, b_job, created_at=utcnow() - LONG_AGO)
    assert runner.sweep() == [b_job]
    # A's running job ends (and the finishing worker's next-job message was lost): A's queued
    # jobs are startable again, and the next sweep sends them.
    set_job(client, running, status="succeeded", finished_at=utcnow())
    assert set(runner.sweep()) == {b_job, *waiting}
    # A worker that went quiet is still found: its job is sent for a takeover.
    set_job(client, running, status="running", heartbeat_at=utcnow() - LONG_AGO)
    assert running in runner.sweep()


@pytest.mark.faiss_only(SCHEDULING)
def test_messages_the_sweeper_sends_never_run_a_job_beyond_the_cap_or_twice(
    client: TestClient,
) -> None:
    """Delivered like Celery messages (``run_next`` per message), every sweep's sends leave the
    capped jobs queued and run no job twice."""
    state = client.app.state.service
    running, waiting = flooded(client)
    runner = Recorder(state.db, state.settings, deliver=True)
    for _ in range(5):
        runner.sweep()
        assert [job_row(client, job_id).status for job_id in waiting] == ["queued"] * 3
        assert all(job_row(client, job_id).attempts == 0 for job_id in waiting)
    # A duplicate message for the running job changes nothing either.
    runner.submit(running)
    assert job_row(client, running).worker == "w" and job_row(client, running).attempts == 1
    set_job(client, running, status="succeeded", finished_at=utcnow())
    runner.sweep()
    # Each delivered message started at most the one job the cap allows at a time (run inline,
    # so each finished before the next message): every job ran exactly once.
    assert [job_row(client, job_id).attempts for job_id in waiting] == [1, 1, 1]
    assert all(job_row(client, job_id).status == "succeeded" for job_id in waiting)
    assert run_next(state.db, state.settings, worker="celery:test:1:1") is Claim.DONE


@pytest.fixture
def celery_client(make_client) -> Iterator[TestClient]:
    require_redis()
    overrides = celery_overrides()
    # A sweep interval longer than the test: only the test's own sweeps send.
    client = make_client(**overrides, job_sweep_interval_s=3600)
    try:
        yield client
    finally:
        redis.Redis.from_url(overrides["redis_url"]).delete(overrides["celery_queue"])


@pytest.mark.faiss_only("the Celery runner with Milvus needs a Milvus server (none in tests)")
def test_sweeps_while_every_worker_is_busy_do_not_pile_messages_in_the_broker(
    celery_client: TestClient,
) -> None:
    """No worker consumes the queue here (all busy): a sweep tops it up to one message per
    startable job, however many sweeps run; it grew by one per job per sweep."""
    client = celery_client
    state = client.app.state.service
    queue = state.settings.celery_queue
    broker = redis.Redis.from_url(state.settings.redis_url)
    broker.delete(queue)
    jobs = queued_jobs(client, 1)
    with state.db.session() as session:
        b_key = create_key(session, "tenant-b").key
    with as_tenant(client, b_key):
        jobs += queued_jobs(client, 1)
    for job_id in jobs:
        set_job(client, job_id, created_at=utcnow() - LONG_AGO)
    for _ in range(5):
        assert set(state.runner.sweep()) == set(jobs)
        assert broker.llen(queue) == len(jobs)
    assert all(job_row(client, job_id).status == "queued" for job_id in jobs)
