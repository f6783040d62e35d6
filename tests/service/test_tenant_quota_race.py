"""A tenant's resource caps hold under concurrent creates (issue 45): the count and the insert
happen under the tenant's lock, so N requests racing for the last slots never leave more than
the limit, on either database."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from app.core import tenancy

LIMIT = 3
RACERS = 8


@pytest.mark.faiss_only
@pytest.mark.parametrize(
    ("route", "body", "setting"),
    [
        (
            "/v1/galleries",
            {"dim": 4, "model_name": "m", "metric": "cosine"},
            "max_galleries_per_tenant",
        ),
        ("/v1/datasets", {}, "max_datasets_per_tenant"),
    ],
    ids=["galleries", "datasets"],
)
def test_racing_creates_never_exceed_the_tenants_limit(
    make_client, monkeypatch, route: str, body: dict, setting: str
) -> None:
    client: TestClient = make_client(**{setting: LIMIT})
    # Widen the window between the count and the insert: every racer has counted before any
    # inserts, unless the count is serialised with the insert.
    real = tenancy.check_name_free
    arrived = threading.Barrier(RACERS, timeout=10)

    def slow_name_check(*args, **kwargs):
        # With the fix only one racer at a time gets here: the barrier breaks, and that is fine.
        with contextlib.suppress(threading.BrokenBarrierError):
            arrived.wait(timeout=2)
        time.sleep(0.2)
        return real(*args, **kwargs)

    for module in ("app.galleries.service", "app.datasets.service"):
        monkeypatch.setattr(f"{module}.check_name_free", slow_name_check)

    def create(i: int) -> int:
        return client.post(route, json=body | {"name": f"racer-{i}"}).status_code

    with ThreadPoolExecutor(RACERS) as pool:
        statuses = list(pool.map(create, range(RACERS)))
    assert sorted(statuses) == [201] * LIMIT + [403] * (RACERS - LIMIT), statuses
    listed = client.get(route, params={"limit": 100}).json()
    items = listed["items"] if isinstance(listed, dict) else listed
    assert len(items) == LIMIT
