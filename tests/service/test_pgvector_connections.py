"""Connections to an attached pgvector table's database kept between searches
(``app.vectors.pgvector.connections``), against the real PostgreSQL 18 with pgvector 0.8.

A connection per request cost about ten times an indexed search (``bench.perf.pgvector_scale``);
the service now keeps up to ``pgvector_idle_connections`` idle read-only connections per set of
connection parameters. What must hold: searches reuse one backend rather than start one each; a
connection the server dropped (a restart) is noticed and replaced, so the first search after the
restart answers as before rather than 503; with ``pgvector_idle_connections = 0`` no connection
outlives its request.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from tests.service.pgvector_server import (  # noqa: F401  (the fixtures)
    PgvectorServer,
    pgvector_database_fixture,
    pgvector_server_fixture,
)
from tests.service.test_pgvector_attach import (  # noqa: F401  (the fixtures)
    HELD_OUT,
    make_settings,
    nouns,
)
from tests.service.test_pgvector_in_place import sql
from tests.service.test_qdrant_attach import attach, top_ids

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")


def service_backends(dsn: str) -> set[int]:
    """Process ids of the service's sessions on the test's database."""
    rows = sql(
        dsn,
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'nobackfill' "
        "AND datname = current_database() AND pid <> pg_backend_pid()",
    )
    return {int(row[0]) for row in rows}


def test_searches_reuse_a_connection_and_survive_a_server_restart(
    client: TestClient,
    nouns: dict,  # noqa: F811  (the fixture imported above)
    pgvector_server: PgvectorServer,
) -> None:
    gallery = attach(client, nouns["source"])
    url = f"/v1/galleries/{gallery['id']}/search"
    body = {"vectors": nouns["old"][HELD_OUT[:4]].tolist(), "k": 5}
    answer = top_ids(client.post(url, json=body))
    first = service_backends(nouns["dsn"])
    assert len(first) == 1, first  # one request, one connection, kept idle
    for _ in range(5):
        assert top_ids(client.post(url, json=body)) == answer
    assert service_backends(nouns["dsn"]) == first  # the same backend answered them all

    pgvector_server.stop()
    pgvector_server.start()
    # The kept connection died with the server: it is dropped and a new one answers.
    assert top_ids(client.post(url, json=body)) == answer
    assert len(service_backends(nouns["dsn"]) - first) == 1


def test_no_connection_outlives_its_request_when_none_are_kept(
    make_client: Callable[..., TestClient],
    nouns: dict,  # noqa: F811  (the fixture imported above)
) -> None:
    client = make_client(pgvector_idle_connections=0)
    gallery = attach(client, nouns["source"])
    body = {"vectors": nouns["old"][HELD_OUT[:4]].tolist(), "k": 5}
    response = client.post(f"/v1/galleries/{gallery['id']}/search", json=body)
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 10
    while service_backends(nouns["dsn"]) and time.monotonic() < deadline:
        time.sleep(0.1)  # a closed connection's backend exits shortly after
    assert service_backends(nouns["dsn"]) == set()
