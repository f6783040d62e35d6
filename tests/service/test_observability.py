"""/metrics (Prometheus text), /readyz (database, Redis with the Celery runner), /healthz."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from tests.service.conftest import problem
from tests.service.test_galleries_api import make_gallery, seed_vectors
from tests.service.test_upgrades_api import RecordingRunner, paired_setup

UNREACHABLE_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/none"
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of GET /metrics: (name, sorted labels) → value."""
    response = client.get("/metrics", headers={"Authorization": ""})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def requests_of(values: dict, route: str) -> dict[tuple[str, str], float]:
    """(method, status) → count of the requests counted under ``route``."""
    out = {}
    for (name, labels), value in values.items():
        label = dict(labels)
        if name == "nobackfill_http_requests_total" and label["route"] == route:
            out[(label["method"], label["status"])] = value
    return out


def test_requests_are_counted_by_route_template(client: TestClient) -> None:
    for n in range(3):
        problem(client.get(f"/v1/galleries/gal_missing{n}"), 404)
    gallery_id = make_gallery(client)
    assert client.get(f"/v1/galleries/{gallery_id}").status_code == 200
    problem(client.get("/no/such/path/at-all"), 404)
    # Refused by the body limit before any route ran: still counted under its route.
    oversized = client.post(
        f"/v1/galleries/{gallery_id}/vectors",
        content=b"{}",
        headers={"Content-Length": str(10**12), "Content-Type": "application/json"},
    )
    problem(oversized, 413)
    values = samples(client)
    template = "/v1/galleries/{gallery_id}"
    assert requests_of(values, template) == {("GET", "404"): 3, ("GET", "200"): 1}
    assert requests_of(values, template + "/vectors") == {("POST", "413"): 1}
    assert requests_of(values, "unmatched") == {("GET", "404"): 1}
    assert requests_of(values, "/v1/galleries") == {("POST", "201"): 1}
    # Raw ids never become route labels.
    routes = {dict(labels).get("route", "") for _, labels in values}
    assert not any("gal_" in route for route in routes), routes
    count = (
        "nobackfill_http_request_duration_seconds_count",
        (("method", "GET"), ("route", template)),
    )
    assert values[count] == 4
    bucket = ("nobackfill_http_request_duration_seconds_bucket",)
    buckets = [
        value
        for (name, labels), value in values.items()
        if (name,) == bucket and dict(labels)["route"] == template
    ]
    assert len(buckets) >= 10 and max(buckets) == 4


def test_jobs_by_state_and_vectors_per_gallery(client: TestClient) -> None:
    state = client.app.state.service
    real, state.runner = state.runner, RecordingRunner()
    try:
        gallery_id, dataset_id = paired_setup(client)
        body = {"dataset_id": dataset_id, "method": "procrustes"}
        first = client.post("/v1/upgrades", json=body).json()
        client.post("/v1/upgrades", json=body)
        assert client.post(f"/v1/upgrades/{first['id']}/cancel").status_code == 200
    finally:
        state.runner = real
    other = make_gallery(client, name="other")
    seed_vectors(client, other, n=7)
    values = samples(client)
    jobs = {
        dict(labels)["state"]: value
        for (name, labels), value in values.items()
        if name == "nobackfill_upgrade_jobs"
    }
    assert jobs == {"queued": 1, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 1}
    vectors = {
        dict(labels)["gallery_id"]: value
        for (name, labels), value in values.items()
        if name == "nobackfill_gallery_vectors"
    }
    assert vectors == {gallery_id: 60, other: 7}
    deleted = client.request(
        "DELETE", f"/v1/galleries/{other}/vectors", json={"ids": ["item-0", "item-1"]}
    )
    assert deleted.status_code == 200, deleted.text
    assert samples(client)[("nobackfill_gallery_vectors", (("gallery_id", other),))] == 5
    assert values[("nobackfill_database_up", ())] == 1


def test_each_app_has_its_own_registry(make_client: Callable[..., TestClient]) -> None:
    first, second = make_client(), make_client()
    for _ in range(2):
        first.get("/healthz")
    second.get("/healthz")
    assert requests_of(samples(first), "/healthz") == {("GET", "200"): 2}
    assert requests_of(samples(second), "/healthz") == {("GET", "200"): 1}


def test_metrics_report_an_unreadable_database(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(UNREACHABLE_POSTGRES)
    monkeypatch.setattr(client.app.state.service.db, "sessions", sessionmaker(engine))
    values = samples(client)
    assert values[("nobackfill_database_up", ())] == 0
    assert not any(name == "nobackfill_upgrade_jobs" for name, _ in values)
    engine.dispose()


def test_readyz_and_healthz(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    anonymous = {"Authorization": ""}
    ready = client.get("/readyz", headers=anonymous)
    assert ready.status_code == 200
    checks = {"database": "ok"}
    if client.app.state.service.settings.vector_engine == "milvus":
        checks["milvus"] = "ok"
    checks["storage"] = "ok"  # the data directory takes writes (test_dependencies_fault.py)
    assert ready.json() == {"status": "ready", "checks": checks}
    assert client.get("/healthz", headers=anonymous).json() == {"status": "ok"}
    engine = create_engine(UNREACHABLE_POSTGRES)
    monkeypatch.setattr(client.app.state.service.db, "engine", engine)
    body = problem(client.get("/readyz", headers=anonymous), 503)
    assert body["detail"].startswith("database does not answer")
    assert body["type"] == "urn:nobackfill:problem:not-ready"
    engine.dispose()


def redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url("redis://127.0.0.1:6379/0", socket_timeout=2).ping())
    except redis.RedisError:
        if os.environ.get("CI"):
            pytest.fail("Redis at 127.0.0.1:6379 is required in CI (.ci/run starts it)")
        return False


@pytest.mark.faiss_only("the Celery runner with Milvus needs a Milvus server (none in tests)")
def test_readyz_checks_redis_with_the_celery_runner(
    make_client: Callable[..., TestClient],
) -> None:
    if not redis_available():
        pytest.skip("Redis is not reachable at 127.0.0.1:6379")
    up = make_client(job_runner="celery", redis_url="redis://127.0.0.1:6379/0")
    assert up.get("/readyz").json() == {
        "status": "ready",
        "checks": {"database": "ok", "redis": "ok", "storage": "ok"},
    }
    down = make_client(job_runner="celery", redis_url=UNREACHABLE_REDIS)
    body = problem(down.get("/readyz"), 503)
    assert body["detail"].startswith("redis does not answer"), body
    assert "database" not in body["detail"]
    # Liveness does not depend on the broker.
    assert down.get("/healthz").status_code == 200


def test_a_database_outage_is_a_503_with_retry_after_and_liveness_holds(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24, failure 7: with the database unreachable, data routes answered 500 (a bug, to
    a client) and /healthz failed too; ~90,000 log lines in 10 s."""
    from sqlalchemy.orm import sessionmaker

    from app.core import errors

    db = client.app.state.service.db
    engine = create_engine(UNREACHABLE_POSTGRES, connect_args={"connect_timeout": 2})
    monkeypatch.setattr(db, "sessions", sessionmaker(engine, expire_on_commit=False))
    monkeypatch.setattr(errors, "_outage_state", {"last": 0.0, "suppressed": 0})
    with caplog.at_level("WARNING", logger="app.core.errors"):
        for _ in range(5):
            response = client.get("/v1/galleries")
            body = problem(response, 503)
            assert response.headers["Retry-After"] == "5", body
    assert client.get("/healthz", headers={"Authorization": ""}).status_code == 200
    outage_lines = [r for r in caplog.records if "database unavailable" in r.getMessage()]
    assert len(outage_lines) == 1
    engine.dispose()


def test_a_full_connection_pool_is_a_503_not_a_500(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    def exhausted(*args, **kwargs):
        raise PoolTimeout("QueuePool limit of size 5 overflow 10 reached")

    monkeypatch.setattr("app.auth.service.tenant_for_key", exhausted)
    response = client.get("/v1/galleries")
    problem(response, 503)
    assert response.headers["Retry-After"] == "1"
