"""Service test fixtures: every API test runs on the embedded SQLite mode and on PostgreSQL, and
with both vector engines (FAISS in the API process, and Milvus).

PostgreSQL (127.0.0.1:5432, trust auth; override with ``NOBACKFILL_TEST_POSTGRES``) gets one
database per test session, migrated once and emptied before each test. Without a reachable
server the PostgreSQL cases are skipped locally and fail under CI (``CI=true``).

Engines: each API test runs as (sqlite, faiss), (postgres, faiss) and (sqlite, milvus), not the
full 2 × 2 product. The vector engine and the SQL backend are independent in the code: with
Milvus the database keeps only gallery metadata, written by the same statements on either
backend as under FAISS (the SQL-specific paths, such as the gallery lock, are exercised by the
PostgreSQL × FAISS case). Measured (2 shared cores, galleries/search/hostile/upgrades test files
on SQLite, both engines in one run, summed test durations): FAISS 46 s, Milvus 52 s. A milvus
case costs about what a FAISS case does, so the three cases take about 1.5 × the two-case suite
(~11 min → ~17 min); a fourth (postgres, milvus) would add another ~6 min for no path the three
leave untested. Each milvus case gets its own milvus-lite file under the test's data dir (a new
file opens in ~0.01 s in a process that has opened one), so tests cannot see each other's
collections. A test about FAISS files or segment files opts out with ``@pytest.mark.faiss_only``
(its reason in the marker's argument); one about Milvus itself runs only as (sqlite, milvus)
with ``@pytest.mark.milvus_only``. A test whose SQL backend is not what it is about (the
engines' own failure paths, an attach's refusals), in a file that covers PostgreSQL elsewhere,
runs on SQLite only with ``@pytest.mark.sqlite_only`` (the suite's time, issue 46's 40 min).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select, text

from app.core.db import migrate
from app.core.settings import Settings
from app.db_models import Base
from app.main import create_app

TEST_KEY = "nbk_test_key_" + "a" * 32
POSTGRES_BASE = os.environ.get(
    "NOBACKFILL_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _admin_dsn() -> str:
    return POSTGRES_BASE.replace("postgresql+psycopg://", "postgresql://")


def postgres_available() -> bool:
    try:
        with psycopg.connect(_admin_dsn(), connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


def create_postgres_database() -> str:
    """A fresh database on the local server; returns its SQLAlchemy URL."""
    name = f"nobackfill_test_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(_admin_dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return POSTGRES_BASE.rsplit("/", 1)[0] + f"/{name}"


def drop_postgres_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(_admin_dsn(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def require_postgres() -> None:
    if postgres_available():
        return
    if os.environ.get("CI"):
        pytest.fail("PostgreSQL at 127.0.0.1:5432 is required in CI (.ci/run starts it)")
    pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    require_postgres()
    url = create_postgres_database()
    migrate(url)
    yield url
    drop_postgres_database(url)


@pytest.fixture
def fresh_postgres() -> Iterator[str]:
    """A database of the test's own, not migrated (a server process migrates it on start)."""
    require_postgres()
    url = create_postgres_database()
    yield url
    drop_postgres_database(url)


def empty_database(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        tables = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
    engine.dispose()


# (SQL backend, vector engine) of every API test; see the module docstring for why three.
CASES = [("sqlite", "faiss"), ("postgres", "faiss"), ("sqlite", "milvus")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    own = metafunc._arg2fixturedefs["backend"][-1].params
    if own is not None:
        # A module that names its own backends (Celery workers on PostgreSQL) gets the engines
        # the cases pair with them.
        engines = sorted({e for b, e in CASES if b in own})
        if "vector_engine" in metafunc.fixturenames:
            metafunc.parametrize("vector_engine", engines, indirect=True)
        return
    if "vector_engine" not in metafunc.fixturenames:
        metafunc.parametrize("backend", sorted({b for b, _ in CASES}), indirect=True)
        return
    marked = metafunc.definition.get_closest_marker
    engines = {"faiss"} if marked("faiss_only") else {"milvus"} if marked("milvus_only") else None
    cases = [case for case in CASES if engines is None or case[1] in engines]
    if marked("sqlite_only"):
        cases = [case for case in cases if case[0] == "sqlite"]
    metafunc.parametrize(
        ("backend", "vector_engine"), cases, indirect=True, ids=[f"{b}-{e}" for b, e in cases]
    )


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def vector_engine(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite database migrated to head, copied for each test (CI time: a fresh migration
    costs about a second, and the suite starts over a thousand SQLite apps; at head the app's
    own migration at start is a no-op of a few milliseconds). The copy is made with SQLite's
    backup API, so it is whole whatever the journal mode."""
    path = tmp_path_factory.mktemp("sqlite-template") / "nobackfill.db"
    migrate(f"sqlite:///{path}")
    return path


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        path = tmp_path / "data" / "nobackfill.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        template = request.getfixturevalue("migrated_sqlite")
        with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(path)) as copy:
            source.backup(copy)
        return f"sqlite:///{path}"
    url = request.getfixturevalue("postgres_url")
    empty_database(url)
    return url


@pytest.fixture
def make_settings(tmp_path: Path, database_url: str, vector_engine: str) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "data_dir": tmp_path / "data",
            "database_url": database_url,
            "vector_engine": vector_engine,
            "job_runner": "inline",
            "bootstrap_key": TEST_KEY,
            "local_key": False,
            "log_level": "warning",
        }
        values.update(overrides)
        return Settings(_env_file=None, **values)

    return make


@pytest.fixture
def make_client(make_settings: Callable[..., Settings]) -> Iterator[Callable[..., TestClient]]:
    """Start an app (lifespan included) on the test's database; several may be started in turn
    (a restart is a new app on the same data)."""
    clients: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        client = TestClient(create_app(make_settings(**overrides)), raise_server_exceptions=False)
        client.__enter__()
        client.headers["Authorization"] = f"Bearer {TEST_KEY}"
        clients.append(client)
        return client

    yield make
    for client in reversed(clients):
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def stop_client(client: TestClient) -> None:
    client.__exit__(None, None, None)


def snapshot(client: TestClient) -> dict[str, Any]:
    """Row counts of every table, each gallery's row, every in-memory index's ids and rows, the
    bytes of every index file and vector segment file, and every Milvus collection's rows and
    id counter: what a rejected request must leave exactly as it was.

    Index files are written in the background, so pending writes are flushed first: the files
    compared are those the in-memory state gives, not whichever the flusher had reached; so is
    the tally of what searches returned (written by its own thread, and on stop)."""
    state = client.app.state.service
    state.indexes.flush()
    state.returned.flush()
    result: dict[str, Any] = {}
    with state.db.sessions() as session:
        for table in Base.metadata.sorted_tables:
            result[table.name] = session.scalar(select(func.count()).select_from(table))
        galleries = Base.metadata.tables["galleries"]
        result["gallery_rows"] = sorted(
            (r.id, r.count, r.index_version, repr(r.vector_manifest))
            for r in session.execute(select(galleries))
        )
        vectors = Base.metadata.tables["gallery_vectors"]
        digest = hashlib.sha256()
        for row in session.execute(select(vectors).order_by(vectors.c.id)):
            digest.update(repr((row.id, row.item_id, row.label)).encode() + row.vector)
        result["vectors_digest"] = digest.hexdigest()
    result["indexes_in_memory"] = {
        gallery_id: (
            version,
            hashlib.sha256(
                index.ids.tobytes() + np.ascontiguousarray(index.lifted).tobytes()
            ).hexdigest(),
        )
        for gallery_id, (version, index) in sorted(state.indexes._indexes.items())
    }
    index_dir = state.settings.index_dir
    result["index_files"] = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (sorted(index_dir.iterdir()) if index_dir.exists() else [])
    }
    vector_dir = state.settings.data_dir / "vectors"
    result["vector_files"] = {
        str(p.relative_to(vector_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (sorted(vector_dir.rglob("*.seg")) if vector_dir.exists() else [])
    }
    result["milvus"] = milvus_contents(state.settings)
    return result


def milvus_contents(settings: Settings) -> dict[str, tuple[str, str]]:
    """Per collection of the settings' Milvus: (its next internal id, a digest of every row)."""
    if settings.vector_engine != "milvus":
        return {}
    from app.vectors.milvus.engine import NEXT_ROW_ID
    from app.vectors.milvus.storage import engine_for

    engine = engine_for(settings)
    contents = {}
    for name in sorted(engine.client.list_collections()):
        properties = engine.client.describe_collection(name).get("properties") or {}
        digest = hashlib.sha256()
        for rows in engine.open_gallery(name).scan():
            for n, item_id in enumerate(rows.item_ids):
                digest.update(
                    repr((item_id, int(rows.row_ids[n]), rows.labels[n], rows.metadata[n])).encode()
                    + rows.vectors[n].tobytes()
                )
        contents[name] = (str(properties.get(NEXT_ROW_ID)), digest.hexdigest())
    return contents


def wait_until(
    predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05
) -> object:
    """``predicate``'s first truthy value, asked every ``interval`` seconds; the test fails
    naming ``what`` when none comes within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def problem(response: Any, status: int) -> dict[str, Any]:
    """Assert an RFC 9457 problem with ``status``; return its body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status
    assert body["type"].startswith("urn:nobackfill:problem:") or body["type"] == "about:blank"
    assert body["title"] and body["detail"]
    return body


def field_names(body: dict[str, Any]) -> list[str]:
    return [e["field"] for e in body.get("errors", [])]
