"""A PostgreSQL that wedges under load (issue 45 item 7), as the soak bench's second phase found
it: beyond the single request of ``test_dependencies_fault.py``.

- The body guard checks a request's key before reading its body. When the database does not
  answer, that check cannot be made: the request used to be counted against its client's
  address instead, so every tenant behind one address (a proxy, a NAT, loopback) shared one
  key's upload cap and got 429 "this API key is already sending 8 request bodies at once" —
  and each such request logged a traceback. It answers 503 with Retry-After now, as the route
  would, logged once per interval.
- A request's session is rolled back once its answer is ready. When the database wedged in
  between, that rollback waited for it and then raised — after the response had started: the
  client lost an answer the server had (the soak saw "no answer" for a job poll; a write's
  acknowledgement could be lost alike), and the log a 500's traceback. A rollback the wedged
  server cannot take now is given up (the connection is dropped already); the answer stands.
- An upgrade running when the database wedges used to crash: failed with the database's error
  as its reason when the write of that could be made, else left running until its heartbeat
  looked stale. A training reads its cancel flag and writes its progress best effort now (as
  its heartbeat): it runs through a short wedge; and a step that cannot do without the
  database (storing the model) sends the job back to the queue once the database answers
  again (the attempt counts), to run to its end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.api.body_guard import identify
from app.api.deps import get_session
from app.core.errors import Problem
from app.upgrades import backbone, executor
from bench.common.fault_proxy import FreezableProxy
from tests.service.conftest import TEST_KEY, wait_until
from tests.service.test_dependencies_fault import start, wedgeable_postgres  # noqa: F401
from tests.service.test_fair_jobs import job_row
from tests.service.test_upgrades_api import paired_setup, quick_upgrade

# Short waits: a wedge of a few seconds outlasts each of them.
BOUNDS = {"db_connect_timeout_s": 2, "db_ping_timeout_s": 0.5, "db_read_timeout_s": 2.0}

StartApp = Callable[..., tuple[TestClient, FreezableProxy]]


@pytest.fixture
def wedgeable_app(
    tmp_path: Path,
    wedgeable_postgres: tuple[str, FreezableProxy],  # noqa: F811
) -> Iterator[StartApp]:
    """Starts the app on the proxied PostgreSQL with ``BOUNDS`` (and the settings it is given);
    after the test, whatever happened, the proxy is thawed before the app is closed, so that
    its shutdown does not wait on a wedge."""
    url, proxy = wedgeable_postgres
    started: list[TestClient] = []

    def start_app(**settings: Any) -> tuple[TestClient, FreezableProxy]:
        started.append(start(tmp_path, database_url=url, **BOUNDS, **settings))
        return started[-1], proxy

    try:
        yield start_app
    finally:
        proxy.thaw()
        for client in started:
            client.__exit__(None, None, None)


def test_a_key_the_wedged_database_cannot_check_answers_503_not_the_address_cap(
    caplog: pytest.LogCaptureFixture, wedgeable_app: StartApp
) -> None:
    client, proxy = wedgeable_app()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/galleries",
        "headers": [(b"authorization", f"Bearer {TEST_KEY}".encode())],
        "client": ("127.0.0.1", 40000),
        "app": client.app,
    }
    assert identify_now(scope).startswith("key:")  # the database answers: the key's identity
    proxy.freeze()
    caplog.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(Problem) as raised:
        identify_now(scope)
    assert raised.value.status == 503
    assert raised.value.headers["Retry-After"] == "5"
    assert not [r for r in caplog.records if r.exc_info], "an outage logs no traceback"
    proxy.thaw()
    assert identify_now(scope).startswith("key:")


def identify_now(scope: dict) -> str:
    import anyio

    return anyio.run(identify, scope)


def test_a_session_whose_rollback_meets_the_wedge_lets_the_answer_stand(
    caplog: pytest.LogCaptureFixture, wedgeable_app: StartApp
) -> None:
    client, proxy = wedgeable_app()
    state = client.app.state.service
    dependency = get_session(state)
    session = next(dependency)
    assert session.execute(text("SELECT 1")).scalar() == 1  # a transaction is open
    proxy.freeze()  # the answer is ready; the database wedges before the teardown
    caplog.clear()
    tic = time.monotonic()
    with caplog.at_level(logging.WARNING), pytest.raises(StopIteration):
        next(dependency)  # the teardown: rolls back, and must not raise
    assert time.monotonic() - tic < BOUNDS["db_read_timeout_s"] + 2
    assert not [r for r in caplog.records if r.exc_info], "an outage logs no traceback"
    proxy.thaw()
    with state.db.sessions() as again:
        assert again.execute(text("SELECT 1")).scalar() == 1


def queue_upgrade(client: TestClient, dataset_id: str) -> str:
    """A quick upgrade of the dataset, accepted: its id."""
    created = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    assert created.status_code == 202, created.text
    return created.json()["id"]


def wait_for_end(client: TestClient, job_id: str) -> None:
    wait_until(
        lambda: job_row(client, job_id).status in ("succeeded", "failed"), 30, "the upgrade to end"
    )


def test_an_upgrade_running_when_the_database_wedges_is_queued_again_and_succeeds(
    monkeypatch: pytest.MonkeyPatch, wedgeable_app: StartApp
) -> None:
    client, proxy = wedgeable_app(job_runner="thread", job_threads=1)
    _, dataset_id = paired_setup(client)
    storing, wedged = threading.Event(), threading.Event()
    real_store = executor._store
    calls = {"n": 0}

    def store_in_the_wedge(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:  # the first attempt stores its model while nothing answers
            storing.set()
            assert wedged.wait(60), "the test never wedged the database"
        return real_store(*args, **kwargs)

    monkeypatch.setattr(executor, "_store", store_in_the_wedge)
    job_id = queue_upgrade(client, dataset_id)
    assert storing.wait(60)
    proxy.freeze()
    wedged.set()
    time.sleep(BOUNDS["db_read_timeout_s"] + 2)
    proxy.thaw()
    wait_for_end(client, job_id)
    row = job_row(client, job_id)
    assert row.status == "succeeded", row.error
    assert row.attempts == 2 and calls["n"] == 2


def test_a_training_runs_through_a_short_wedge_without_losing_its_attempt(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, wedgeable_app: StartApp
) -> None:
    """Between its optimiser steps a training reads its cancel flag and writes its progress;
    a wedge used to turn the first of those into a crash (then, with the queueing above, a
    lost attempt: the soak's long flood job failed after three wedges). The flag and the
    progress are best effort while the database does not answer: the training goes on."""
    client, proxy = wedgeable_app(job_runner="thread", job_threads=1)
    _, dataset_id = paired_setup(client)
    gate, entered = threading.Event(), threading.Event()
    real_train = backbone.train

    def stepping(*args, **kwargs):
        hooks = kwargs["hooks"]
        entered.set()
        epoch = 0
        while not gate.is_set():  # steps, until the test has wedged and thawed the database
            epoch += 1
            hooks.report(epoch, 1000, 1.0)
            hooks.check()
            time.sleep(0.2)
        return real_train(*args, **kwargs)

    monkeypatch.setattr(backbone, "train", stepping)
    job_id = queue_upgrade(client, dataset_id)
    assert entered.wait(30)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        proxy.freeze()
        time.sleep(BOUNDS["db_read_timeout_s"] + 2)
        proxy.thaw()
        time.sleep(1.5)  # a cancel poll and a progress report after the thaw
        gate.set()
        wait_for_end(client, job_id)
    row = job_row(client, job_id)
    assert row.status == "succeeded", row.error
    assert row.attempts == 1
    assert not [r for r in caplog.records if r.exc_info], "an outage logs no traceback"
