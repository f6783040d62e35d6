"""The production shape with a Milvus *server*: a real Milvus server (Milvus 2.3.5 standalone, the
tests' shared one from ``tests/service/milvus_server.py``; until issue 46 a milvus-lite gRPC
server process stood in for it, and hid that the first unlabelled upload failed on a real one),
``nobackfill serve`` with the Celery runner on PostgreSQL and Redis, and a real Celery worker
process. An upgrade trained by the
worker answers a search, and the gallery's vectors live in the Milvus server: a pymilvus client of
its own sees the collection with every item, while the database and the data directory hold no
vector (no SQL row, no segment file, no FAISS index file)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymilvus import MilvusClient
from sqlalchemy import create_engine, func, select

from app.core.settings import Settings
from app.galleries.models import Gallery
from app.vectors.milvus.storage import collection_name
from app.vectors.tables import GalleryVector
from bench.common.service import free_port
from tests.service.celery_worker import (
    celery_overrides,
    celery_worker,
    require_redis,
    worker_env,
)
from tests.service.milvus_server import (  # noqa: F401  (milvus_server_uri: the fixture)
    dropped_after,
    milvus_server_uri,
)
from tests.service.test_installed_stack import KEY, stop, upgrade_through_the_api, wait_ready

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ITEMS = 200  # the gallery ``upgrade_through_the_api`` uploads


@pytest.fixture
def milvus_uri(milvus_server_uri: str) -> Iterator[str]:  # noqa: F811
    """The shared Milvus server; the collections the test made there are dropped after it."""
    with dropped_after(milvus_server_uri):
        yield milvus_server_uri


@pytest.fixture
def settings(tmp_path: Path, fresh_postgres: str, milvus_uri: str) -> Settings:
    require_redis()
    return Settings(
        _env_file=None,
        data_dir=tmp_path / "data",
        database_url=fresh_postgres,
        vector_engine="milvus",
        milvus_uri=milvus_uri,
        bootstrap_key=KEY,
        local_key=False,
        log_level="warning",
        **celery_overrides(),
    )


@pytest.fixture
def api(settings: Settings, tmp_path: Path) -> Iterator[str]:
    """``nobackfill serve`` (this checkout's, as ``python -m app.cli``) on the settings; its URL."""
    port = free_port()
    # The worker's environment (database, data dir, queue, Milvus) and the API's own settings.
    env = worker_env(settings)
    env.update(
        {
            "NOBACKFILL_JOB_RUNNER": "celery",
            "NOBACKFILL_VECTOR_ENGINE": settings.vector_engine,
            "NOBACKFILL_MILVUS_URI": settings.resolved_milvus_uri,
            "NOBACKFILL_BOOTSTRAP_KEY": KEY,
            "NOBACKFILL_LOCAL_KEY": "false",
            "NOBACKFILL_LOG_LEVEL": "warning",
            "OMP_NUM_THREADS": "1",
        }
    )
    log_path = tmp_path / "api.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, server, log_path)
        yield url
    finally:
        stop(server)


def test_an_upgrade_runs_through_celery_on_a_milvus_server(
    settings: Settings, api: str, tmp_path: Path
) -> None:
    assert not settings.milvus_lite
    worker_log = tmp_path / "worker.log"
    # The API migrated the database on its start; the worker starts after it.
    with celery_worker(settings, worker_log) as worker:
        gallery_id = upgrade_through_the_api(api, worker, worker_log)

    milvus = MilvusClient(uri=settings.resolved_milvus_uri)
    try:
        name = collection_name(gallery_id)
        assert name in milvus.list_collections()
        [row] = milvus.query(
            name, filter="", output_fields=["count(*)"], consistency_level="Strong"
        )
        assert row["count(*)"] == ITEMS
    finally:
        milvus.close()

    engine = create_engine(settings.resolved_database_url)
    try:
        with engine.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(GalleryVector)) == 0
            storages = conn.execute(select(Gallery.id, Gallery.vector_storage)).all()
    finally:
        engine.dispose()
    assert dict(storages)[gallery_id] == "milvus"
    assert {storage for _, storage in storages} == {"milvus"}
    assert not (settings.data_dir / "vectors").exists()
    index_dir = settings.index_dir
    assert not index_dir.exists() or not any(index_dir.iterdir())
    # Nothing of the milvus-lite file engine either: the API and the worker used the server.
    assert not (settings.data_dir / "milvus.db").exists()
