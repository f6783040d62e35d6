"""Property-based fuzzing of every operation in our OpenAPI document (schemathesis: valid and
invalid bodies, parameters and headers) against a real uvicorn server on loopback, embedded
mode, with an API key: no request may answer 5xx, and every 4xx is problem+json.

Bounded: ``EXAMPLES`` valid and as many invalid cases per operation and backend, derandomised so CI replays the same cases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from bench.common.service import BENCH_KEY, RunningService, create_gallery, start_service
from tests.service.conftest import (
    create_postgres_database,
    drop_postgres_database,
    require_postgres,
)

MAX_EXAMPLES = 60
# The second and third backends get fewer cases of the same derandomised generator: what they can
# fail on differently (PostgreSQL's refusals of text SQLite stores, Milvus filter expressions) is
# in the field values, which a few dozen cases per operation already vary; the full count on
# every backend cost about 2 of CI's minutes each.
EXAMPLES = {"sqlite": MAX_EXAMPLES, "postgres": 25, "sqlite-milvus": 25}
AUTH = {"Authorization": f"Bearer {BENCH_KEY}"}


@pytest.fixture(scope="module", params=["sqlite", "postgres", "sqlite-milvus"])
def fuzzed_service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningService]:
    """The server on the embedded SQLite and on PostgreSQL (which refuses some text SQLite
    stores, e.g. NUL bytes, so each backend can fail differently), and on SQLite with the Milvus
    engine (whose filter expressions and fields take the item ids and labels generated here;
    the service tests' conftest says why not on PostgreSQL too)."""
    data_dir: Path = tmp_path_factory.mktemp("schemathesis") / "data"
    env = {
        "NOBACKFILL_MAX_VECTORS_PER_REQUEST": "50",
        "NOBACKFILL_MAX_REQUEST_BYTES": "65536",
        # One client sends every case, some with mangled keys: throttled after 20, the rest
        # would all be 429s and fuzz nothing (test_auth.py shows the throttle).
        "NOBACKFILL_AUTH_FAILURE_LIMIT": "1000000",
    }
    if request.param == "sqlite-milvus":
        env["NOBACKFILL_VECTOR_ENGINE"] = "milvus"
    database_url = None
    if request.param == "postgres":
        require_postgres()
        database_url = create_postgres_database()
        env["NOBACKFILL_DATABASE_URL"] = database_url
    # Small limits, so that generated cases reach them too.
    service = start_service(data_dir, env, startup_timeout=120)
    try:
        yield service
    finally:
        service.stop()
        if database_url is not None:
            drop_postgres_database(database_url)
    errors = [line for line in service.log_path.read_text().splitlines() if "unhandled" in line]
    assert errors == [], errors


@pytest.fixture(scope="module")
def seeded_gallery(fuzzed_service: RunningService) -> str:
    """A gallery with vectors, so that generated cases also reach a real gallery's handlers
    instead of answering 404 for every random id."""
    gallery_id = create_gallery(
        fuzzed_service, {"name": "fuzz", "dim": 4, "model_name": "m", "metric": "cosine"}
    )
    with fuzzed_service.client() as client:
        body = {"ids": ["a", "b", "c"], "vectors": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]}
        client.post(f"/v1/galleries/{gallery_id}/vectors", json=body).raise_for_status()
    return gallery_id


def check_operation(
    operation, mode: GenerationMode, service: RunningService, gallery_id: str, http, examples: int
) -> int:
    """Run up to the backend's number of generated cases of one operation; raise on the first bad
    answer. Returns how many requests were sent."""
    sent = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        # No shrinking: the failing case is reported as generated, within the time bound.
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        nonlocal sent
        params = case.path_parameters or {}
        # Half of the cases (by the generated id's length) aim at the seeded gallery.
        if "gallery_id" in params and len(str(params["gallery_id"])) % 2 == 0:
            params["gallery_id"] = gallery_id
        response = case.call(base_url=service.url, session=http, headers=AUTH, timeout=60)
        sent += 1
        where = (case.method, case.formatted_path, response.status_code)
        assert response.status_code < 500, (*where, response.text[:500])
        if response.status_code >= 400:
            content_type = response.headers.get("content-type", [""])[0]
            assert content_type.startswith("application/problem+json"), (*where, content_type)

    run()
    return sent


@pytest.mark.slow
def test_no_server_errors(
    fuzzed_service: RunningService, seeded_gallery: str, request: pytest.FixtureRequest
) -> None:
    examples = EXAMPLES[request.node.callspec.params["fuzzed_service"]]
    schema = schemathesis.openapi.from_url(f"{fuzzed_service.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    failures, sent = [], 0
    with requests.Session() as http:
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    sent += check_operation(
                        operation, mode, fuzzed_service, seeded_gallery, http, examples
                    )
                except Unsatisfiable:
                    # Nothing of this operation can be made invalid (e.g. GET /healthz).
                    assert mode is GenerationMode.NEGATIVE, operation.label
                except Exception as exc:  # collected: one run reports every failing operation
                    failures.append(f"{operation.label} [{mode}]: {exc}")
    assert failures == [], "\n".join(failures)
    # Guards against a vacuous run (e.g. every case filtered out before reaching the server).
    assert sent >= len(operations) * examples, sent
    print(f"schemathesis: {sent} requests over {len(operations)} operations, no 5xx")
