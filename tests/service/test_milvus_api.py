"""``NOBACKFILL_VECTOR_ENGINE=milvus`` behind the API, beyond what every API test checks on both
engines: a Milvus gallery answers searches like the FAISS one, holds nothing in the API process,
drops its collection with the gallery, converges when a write's SQL commit failed after Milvus
had it, keeps every acknowledged write through ``kill -9``, and a milvus-lite file is refused to
a Celery deployment (another process could not open it).

The tests that start the app run twice: on the default milvus-lite file, and on a real Milvus
server (``tests/service/milvus_server.py``: Milvus 2.3.5 standalone), where a gallery's
collection is created and written as in production (``make_settings`` below).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import func, select

from app.core.settings import Settings
from app.galleries import service as gallery_service
from app.galleries.models import Gallery
from app.vectors.milvus.storage import collection_name, engine_for
from app.vectors.tables import GalleryVector
from bench.common.service import create_gallery, start_service
from tests.service.conftest import problem, stop_client
from tests.service.milvus_server import (  # noqa: F401  (milvus_server_uri: the fixture)
    dropped_after,
    milvus_server_uri,
)
from tests.service.test_crash import check_all_or_nothing, kill_mid_ingest, nearest
from tests.service.test_galleries_api import make_gallery, seed_vectors

pytestmark = pytest.mark.milvus_only("compares the Milvus engine with FAISS, or is about Milvus")


@pytest.fixture(params=["lite", "server"])
def make_settings(
    request: pytest.FixtureRequest, make_settings: Callable[..., Settings]
) -> Iterator[Callable[..., Settings]]:
    """The conftest's settings, on milvus-lite or on the shared Milvus standalone server (the
    collections a test made there are dropped after it)."""
    if request.param == "lite":
        yield make_settings
        return
    uri = request.getfixturevalue("milvus_server_uri")
    with dropped_after(uri):
        yield lambda **overrides: make_settings(**({"milvus_uri": uri} | overrides))


GALLERIES = [
    {"name": "cosine", "dim": 8, "model_name": "m", "metric": "cosine"},
    {"name": "cosine-hnsw", "dim": 8, "model_name": "m", "metric": "cosine", "index": "hnsw"},
    {"name": "dot", "dim": 8, "model_name": "m", "metric": "dot"},
]


def search(client: TestClient, gallery_id: str, queries: np.ndarray, k: int) -> list[list[dict]]:
    response = client.post(
        f"/v1/galleries/{gallery_id}/search", json={"vectors": queries.tolist(), "k": k}
    )
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_milvus_galleries_answer_searches_like_faiss(make_client, tmp_path: Path) -> None:
    milvus = make_client()
    faiss_dir = tmp_path / "faiss"
    faiss = make_client(
        vector_engine="faiss",
        data_dir=faiss_dir,
        database_url=f"sqlite:///{faiss_dir / 'nobackfill.db'}",
    )
    rng = np.random.default_rng(3)
    # Fewer items than Milvus's candidate list (k′): both engines then rank the whole gallery by
    # the exact float64 distance, so the answers must agree item for item.
    n = 150
    vectors = (0.3 * rng.normal(size=(n, 8))).astype(np.float32)
    # Fresh points, and stored ones (found at distance 0 on both engines).
    queries = np.concatenate([0.3 * rng.normal(size=(6, 8)), vectors[:3]]).astype(np.float32)
    body = {
        "ids": [f"item-{i}" for i in range(n)],
        "vectors": vectors.tolist(),
        "labels": [f"class-{i % 4}" for i in range(n)],
    }
    for spec in GALLERIES:
        found = []
        for client in (milvus, faiss):
            gallery_id = make_gallery(client, **spec)
            stored = client.post(f"/v1/galleries/{gallery_id}/vectors", json=body)
            assert stored.status_code == 200, stored.text
            found.append(search(client, gallery_id, queries, k=12))
        on_milvus, on_faiss = found
        for got, want in zip(on_milvus, on_faiss, strict=True):
            assert [h["id"] for h in got] == [h["id"] for h in want], spec["name"]
            assert [h.get("label") for h in got] == [h.get("label") for h in want]
            assert [set(h) for h in got] == [set(h) for h in want]
            for key in ("distance", "score"):
                np.testing.assert_allclose(
                    [h[key] for h in got], [h[key] for h in want], rtol=1e-5, atol=1e-6
                )

    state = milvus.app.state.service
    # Nothing per gallery in the API process: no FAISS index in memory or on disk, no SQL row
    # or segment file per vector; the collections hold the items.
    assert state.indexes._indexes == {}
    assert not state.settings.index_dir.exists() or not any(state.settings.index_dir.iterdir())
    assert not (state.settings.data_dir / "vectors").exists()
    engine = engine_for(state.settings)
    with state.db.session() as session:
        assert session.scalar(select(func.count()).select_from(GalleryVector)) == 0
        galleries = list(session.scalars(select(Gallery)))
    assert {g.vector_storage for g in galleries} == {"milvus"}
    for gallery in galleries:
        assert engine.open_gallery(collection_name(gallery.id)).count() == n


def test_unlabelled_items_read_back_without_a_label_or_metadata(make_client) -> None:
    """Issue 46: on a Milvus 2.3 server the first upload without labels answered 500 (the
    server has no nullable fields and refused the null label). Items uploaded without a label
    or metadata read back without one, labelled ones with theirs, also after a restart (which
    reads the collection's schema back), and searches name labels only where there are some."""
    client = make_client()
    gallery_id = make_gallery(client)
    url = f"/v1/galleries/{gallery_id}/vectors"
    bare = client.post(url, json={"ids": ["a", "b"], "vectors": [[1, 0, 0, 0], [0, 1, 0, 0]]})
    assert bare.status_code == 200, bare.text
    labelled = {
        "ids": ["c", "d"],
        "vectors": [[0, 0, 1, 0], [0, 0, 0, 1]],
        "labels": ["cat", "dog"],
        "metadata": [{"n": 1, "tags": ["x", None]}, {}],
    }
    assert client.post(url, json=labelled).status_code == 200
    expected = {
        "ids": ["a", "b", "c", "d"],
        "labels": [None, None, "cat", "dog"],
        "metadata": [None, None, {"n": 1, "tags": ["x", None]}, {}],
    }
    for app in (client, None):
        if app is None:
            stop_client(client)
            app = make_client()
        read = app.get(url, params={"ids": expected["ids"]})
        assert read.status_code == 200, read.text
        assert {key: read.json()[key] for key in expected} == expected
        hits = search(app, gallery_id, np.eye(4)[[0, 2]], k=1)
        assert [row[0]["id"] for row in hits] == ["a", "c"]
        assert "label" not in hits[0][0] and hits[1][0]["label"] == "cat"
    # A label given later replaces the absent one, and is read back.
    relabel = {"ids": ["a"], "vectors": [[1, 0, 0, 0]], "labels": ["ant"]}
    assert app.post(url, json=relabel).status_code == 200
    assert app.get(url, params={"ids": ["a"]}).json()["labels"] == ["ant"]


def test_deleting_a_gallery_drops_its_collection(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    engine = engine_for(client.app.state.service.settings)
    assert engine.has_gallery(collection_name(gallery_id))
    assert client.delete(f"/v1/galleries/{gallery_id}").status_code == 204
    assert not engine.has_gallery(collection_name(gallery_id))


def test_a_write_whose_commit_failed_converges_when_retried(make_client, monkeypatch) -> None:
    """Milvus has a write before the SQL commit (the documented difference from the other
    storages): a failed commit leaves the items in Milvus; the retried request, idempotent,
    brings count and search back in step, and a restart repairs the count without one."""
    client = make_client()
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id)

    def fail(*args, **kwargs) -> None:
        raise RuntimeError("failed between the Milvus write and the commit")

    monkeypatch.setattr(gallery_service, "_forget_reembedded", fail)
    late = {"ids": ["item-0", "late"], "vectors": [[9, 9, 9, 9], [1, 1, 1, 1]]}
    assert client.post(f"/v1/galleries/{gallery_id}/vectors", json=late).status_code == 500
    monkeypatch.undo()
    assert client.get(f"/v1/galleries/{gallery_id}").json()["count"] == 20

    stop_client(client)
    restarted = make_client()
    # The startup check reads the count back from Milvus.
    assert restarted.get(f"/v1/galleries/{gallery_id}").json()["count"] == 21
    retried = restarted.post(f"/v1/galleries/{gallery_id}/vectors", json=late)
    assert retried.json() == {"upserted": 2, "count": 21}
    top = search(restarted, gallery_id, np.array([[9, 9, 9, 9], vectors[1]]), k=1)
    assert [row[0]["id"] for row in top] == ["item-0", "item-1"]


def test_readyz_names_milvus_when_it_does_not_answer(client: TestClient, monkeypatch) -> None:
    assert client.get("/readyz").json()["checks"] == {
        "database": "ok",
        "milvus": "ok",
        "storage": "ok",
    }
    engine = engine_for(client.app.state.service.settings)

    def down(*args, **kwargs) -> None:
        raise ConnectionError("milvus is down")

    monkeypatch.setattr(engine.client, "list_collections", down)
    body = problem(client.get("/readyz"), 503)
    assert body["detail"].startswith("milvus does not answer"), body


def test_milvus_lite_is_refused_to_a_celery_worker() -> None:
    with pytest.raises(ValidationError, match="milvus-lite file is opened by one process"):
        Settings(_env_file=None, vector_engine="milvus", job_runner="celery")
    server = Settings(
        _env_file=None,
        vector_engine="milvus",
        job_runner="celery",
        milvus_uri="http://milvus:19530",
    )
    assert not server.milvus_lite


def test_a_celery_process_without_a_milvus_server_refuses_milvus_galleries(tmp_path: Path) -> None:
    """A worker started without NOBACKFILL_VECTOR_ENGINE / NOBACKFILL_MILVUS_URI (engine left at
    faiss) meets a gallery the API stored in Milvus: it must say what is missing, not open an
    empty milvus-lite file of its own and fail the job on missing vectors."""
    from app.vectors.milvus.storage import engine_for

    worker = Settings(_env_file=None, data_dir=tmp_path, job_runner="celery")
    with pytest.raises(RuntimeError, match="NOBACKFILL_MILVUS_URI"):
        engine_for(worker)
    assert not (tmp_path / "milvus.db").exists()


@pytest.mark.slow
def test_acknowledged_writes_survive_kill_9(tmp_path: Path) -> None:
    """An upsert answered 200 is in Milvus's write-ahead log (milvus-lite flushes it to the OS
    before answering): killing the API process mid-ingest loses no acknowledged batch, and a
    batch cut off by the kill is stored entirely or not at all."""
    data_dir = tmp_path / "data"
    env = {"NOBACKFILL_VECTOR_ENGINE": "milvus", "NOBACKFILL_LOG_LEVEL": "info"}
    service = start_service(data_dir, env, startup_timeout=180)
    gallery_id = create_gallery(
        service, {"name": "crash", "dim": 8, "model_name": "m", "metric": "cosine"}
    )
    rng = np.random.default_rng(7)
    acked: dict[str, np.ndarray] = {}
    cut_off: list[dict[str, np.ndarray]] = []
    for round_no in range(3):
        # A few batches go through before the kill (the first write creates the collection).
        ingest = kill_mid_ingest(service, gallery_id, round_no, float(rng.uniform(2.0, 4.0)))
        acked.update(ingest.acked)
        if ingest.in_flight:
            cut_off.append(ingest.in_flight)
        service = start_service(data_dir, env, startup_timeout=180)
        with service.client(timeout=120) as client:
            assert nearest(client, gallery_id, acked) == list(acked), f"round {round_no}"
            check_all_or_nothing(client, gallery_id, acked, cut_off)
    service.stop()
    assert len(acked) > 0
    with sqlite3.connect(data_dir / "nobackfill.db") as connection:
        storage = connection.execute(
            "SELECT vector_storage FROM galleries WHERE id = ?", (gallery_id,)
        ).fetchone()[0]
        rows = connection.execute("SELECT count(*) FROM gallery_vectors").fetchone()[0]
    assert storage == "milvus" and rows == 0
