"""A Redis broker that wedges after the start (issue 45 item 7): the API published through it,
then it keeps its connections open and answers nothing — a freezable proxy in front of the real
Redis. Creating an upgrade must still answer within seconds (202, the job queued in the database
for the sweeper, as with Redis down), bounded by ``REDIS_SOCKET_TIMEOUT_S`` /
``REDIS_CONNECT_TIMEOUT_S``; and those settings refuse values that would disable the bound."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.core.settings import Settings
from bench.common.fault_proxy import FreezableProxy
from tests.service.celery_worker import REDIS_URL, require_redis
from tests.service.test_jobs import job_row
from tests.service.test_upgrades_api import paired_setup, quick_upgrade


@pytest.fixture
def wedgeable_redis() -> Iterator[tuple[FreezableProxy, str]]:
    """The test Redis behind a freezable proxy, and a queue of the test's own (removed after)."""
    require_redis()
    upstream = redis.Redis.from_url(REDIS_URL)
    host = upstream.connection_pool.connection_kwargs["host"]
    port = upstream.connection_pool.connection_kwargs["port"]
    proxy = FreezableProxy((host, port))
    queue = f"nobackfill-wedge-{secrets.token_hex(4)}"
    try:
        yield proxy, queue
    finally:
        proxy.thaw()
        proxy.stop()
        upstream.delete(queue)
        upstream.close()


@pytest.mark.faiss_only("the Celery runner with Milvus needs a Milvus server (none in tests)")
@pytest.mark.parametrize("socket_timeout_s", [0.5, 1.5])
def test_a_redis_that_wedges_after_the_start_answers_the_create_within_its_timeout(
    make_client: Callable[..., TestClient],
    wedgeable_redis: tuple[FreezableProxy, str],
    socket_timeout_s: float,
) -> None:
    proxy, queue = wedgeable_redis
    client = make_client(
        job_runner="celery",
        redis_url=f"redis://127.0.0.1:{proxy.port}/{REDIS_URL.rsplit('/', 1)[1]}",
        celery_queue=queue,
        redis_socket_timeout_s=socket_timeout_s,
        redis_connect_timeout_s=socket_timeout_s,
    )
    _, dataset_id = paired_setup(client)
    # Healthy: the message reaches Redis, over a connection the producer pool keeps.
    sent = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    assert sent.status_code == 202, sent.text
    assert redis.Redis.from_url(REDIS_URL).llen(queue) == 1

    proxy.freeze()
    tic = time.monotonic()
    held = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    elapsed = time.monotonic() - tic
    assert held.status_code == 202, held.text
    # The publish waited for the configured answer and no longer: the setting is what bounds it
    # (one timeout, then the request answers; slack for a shared machine).
    assert socket_timeout_s * 0.9 <= elapsed < socket_timeout_s + 1.5, elapsed
    # Queued in the database, not sent: the sweeper sends it once the broker answers again.
    assert job_row(client, held.json()["id"]).status == "queued"
    assert redis.Redis.from_url(REDIS_URL).llen(queue) == 1


@pytest.mark.parametrize("name", ["REDIS_SOCKET_TIMEOUT_S", "REDIS_CONNECT_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["0", "-1", "31", "soon"])
def test_redis_timeouts_from_the_environment_are_validated(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """0 would mean no wait at all to redis-py (every publish fails), and a long one would hold
    requests again: both refused at start, naming the setting."""
    monkeypatch.setenv(f"NOBACKFILL_{name}", value)
    with pytest.raises(ValidationError) as raised:
        Settings(_env_file=None)
    assert name.lower() in str(raised.value)


def test_redis_timeouts_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOBACKFILL_REDIS_SOCKET_TIMEOUT_S", "2.5")
    monkeypatch.setenv("NOBACKFILL_REDIS_CONNECT_TIMEOUT_S", "1")
    settings = Settings(_env_file=None)
    assert (settings.redis_socket_timeout_s, settings.redis_connect_timeout_s) == (2.5, 1.0)
