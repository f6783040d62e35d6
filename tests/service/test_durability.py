"""Restarting loses nothing; the startup check repairs an index that disagrees with the database
(missing, torn, stale or orphaned files) and says so in the log."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.galleries.models import Gallery
from app.upgrades import backbone
from tests.service.celery_worker import wait_for_job
from tests.service.conftest import snapshot, stop_client
from tests.service.test_galleries_api import make_gallery, seed_vectors
from tests.service.test_jobs import slow_trainer
from tests.service.test_upgrades_api import paired_setup, quick_upgrade


def top_ids(client: TestClient, gallery_id: str, queries: np.ndarray, k: int = 3) -> list:
    response = client.post(
        f"/v1/galleries/{gallery_id}/search", json={"vectors": queries.tolist(), "k": k}
    )
    assert response.status_code == 200, response.text
    return [[hit["id"] for hit in row] for row in response.json()["results"]]


def test_restart_brings_everything_back(make_client) -> None:
    client = make_client()
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id)
    dataset = client.post("/v1/datasets", json={"name": "d", "gallery_id": gallery_id}).json()
    expected = top_ids(client, gallery_id, vectors[:4])
    before = snapshot(client)
    stop_client(client)

    restarted = make_client()
    assert snapshot(restarted) == before
    assert top_ids(restarted, gallery_id, vectors[:4]) == expected
    assert restarted.get(f"/v1/datasets/{dataset['id']}").json() == dataset
    assert restarted.get(f"/v1/galleries/{gallery_id}").json()["count"] == 20


INDEX_FILES = "about the FAISS index files of the API process (a Milvus gallery has none)"


@pytest.mark.faiss_only(INDEX_FILES)
@pytest.mark.parametrize("damage", ["missing", "torn", "stale", "orphan"])
def test_startup_check_repairs_the_index(make_client, caplog, damage: str) -> None:
    client = make_client()
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id)
    expected = top_ids(client, gallery_id, vectors[:4])
    state = client.app.state.service
    state.indexes.flush()
    index_dir = state.settings.index_dir
    [index_file] = list(index_dir.glob(f"{gallery_id}.v*.npz"))
    stop_client(client)

    if damage == "missing":
        index_file.unlink()
    elif damage == "torn":
        index_file.write_bytes(index_file.read_bytes()[:100])
    elif damage == "stale":
        # As after a crash between the commit of an ingest and the save of its index.
        with state.db.session() as session:
            session.execute(
                update(Gallery)
                .where(Gallery.id == gallery_id)
                .values(index_version=Gallery.index_version + 1)
            )
    else:
        (index_dir / "gal_deleted.v3.npz").write_bytes(b"left over")
        (index_dir / f".{index_file.name}.123.tmp").write_bytes(b"half written")

    with caplog.at_level(logging.INFO):
        restarted = make_client()
    messages = " ".join(r.getMessage() for r in caplog.records)
    if damage == "orphan":
        assert "removed 2 orphan index files" in messages
        assert sorted(p.name for p in index_dir.iterdir()) == [index_file.name]
    else:
        assert f"index for gallery {gallery_id} rebuilt from 20 stored vectors" in messages
    assert top_ids(restarted, gallery_id, vectors[:4]) == expected
    files = list(index_dir.glob(f"{gallery_id}.v*.npz"))
    assert len(files) == 1


def index_files(client: TestClient, gallery_id: str) -> list[str]:
    index_dir = client.app.state.service.settings.index_dir
    return sorted(p.name for p in index_dir.glob(f"{gallery_id}.*"))


@pytest.mark.faiss_only(INDEX_FILES)
def test_index_files_follow_committed_versions(client: TestClient) -> None:
    """A flush writes the file of the committed version and removes older ones."""
    store = client.app.state.service.indexes
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    version = store._indexes[gallery_id][0]
    assert store.flush() == [gallery_id]
    assert index_files(client, gallery_id) == [f"{gallery_id}.v{version}.npz"]
    client.request("DELETE", f"/v1/galleries/{gallery_id}/vectors", json={"ids": ["item-1"]})
    assert store.flush() == [gallery_id]
    assert store.flush() == []
    assert index_files(client, gallery_id) == [f"{gallery_id}.v{version + 1}.npz"]
    assert client.delete(f"/v1/galleries/{gallery_id}").status_code == 204
    assert index_files(client, gallery_id) == []


@pytest.mark.faiss_only(INDEX_FILES)
def test_writes_are_flushed_in_the_background(make_client) -> None:
    client = make_client(index_flush_interval_s=0.2)
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    version = client.app.state.service.indexes._indexes[gallery_id][0]
    deadline = time.monotonic() + 10
    while index_files(client, gallery_id) != [f"{gallery_id}.v{version}.npz"]:
        assert time.monotonic() < deadline, index_files(client, gallery_id)
        time.sleep(0.05)


@pytest.mark.faiss_only(INDEX_FILES)
def test_a_file_left_stale_by_a_crash_is_rebuilt(make_client, caplog) -> None:
    """An acknowledged write whose file was never flushed (the process died first) is restored
    from the database at the next start."""
    client = make_client(index_flush_interval_s=3600)
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id)
    client.app.state.service.indexes.flush()
    index_dir = client.app.state.service.settings.index_dir
    on_disk = {p.name: p.read_bytes() for p in index_dir.iterdir()}
    more = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    response = client.post(
        f"/v1/galleries/{gallery_id}/vectors",
        json={"ids": [f"new-{i}" for i in range(5)], "vectors": more.tolist()},
    )
    assert response.status_code == 200, response.text
    assert index_files(client, gallery_id) == sorted(on_disk), "written before any flush"
    expected = top_ids(client, gallery_id, np.concatenate([vectors[:2], more]), k=1)
    stop_client(client)
    # The disk as a kill -9 leaves it: the flush at shutdown never happened.
    for path in index_dir.iterdir():
        path.unlink()
    for name, data in on_disk.items():
        (index_dir / name).write_bytes(data)

    with caplog.at_level(logging.INFO):
        restarted = make_client(index_flush_interval_s=3600)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert f"index for gallery {gallery_id} rebuilt from 25 stored vectors" in messages
    assert "no index file for the committed version" in messages
    assert top_ids(restarted, gallery_id, np.concatenate([vectors[:2], more]), k=1) == expected
    assert expected == [["item-0"], ["item-1"]] + [[f"new-{i}"] for i in range(5)]


def test_a_job_interrupted_by_a_restart_resumes(make_client, monkeypatch) -> None:
    """Embedded mode: stopping the API hands a running job back to the queue; the next start
    runs it to the end."""
    real_train, started = backbone.train, threading.Event()
    monkeypatch.setattr(backbone, "train", slow_trainer(10_000, started))
    client = make_client(job_runner="thread")
    _, dataset_id = paired_setup(client)
    job_id = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    job_id = job_id.json()["id"]
    assert started.wait(30)
    stop_client(client)

    monkeypatch.setattr(backbone, "train", real_train)
    restarted = make_client(job_runner="thread")
    job = wait_for_job(restarted, job_id, timeout=120)
    assert job["status"] == "succeeded" and job["attempts"] == 1, job


@pytest.mark.faiss_only
def test_a_rebuild_at_start_holds_no_transaction_idle(make_client, monkeypatch) -> None:
    """Rebuilding a large gallery's index at start (lifting and indexing a million rows takes
    minutes) must not keep a database transaction open meanwhile: PostgreSQL ends a session idle
    in a transaction past `pg_idle_in_transaction_timeout_ms`, and the start failed with it."""
    from app.galleries import service as gallery_service

    client = make_client(index_flush_interval_s=3600)
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id)
    expected = top_ids(client, gallery_id, vectors[:3], k=2)
    stop_client(client)
    index_dir = client.app.state.service.settings.index_dir
    for path in index_dir.iterdir():
        path.unlink()
    real_lift = gallery_service.lifted_points

    def slow_lift(gallery, array):
        time.sleep(1.5)  # three times the idle timeout below
        return real_lift(gallery, array)

    monkeypatch.setattr(gallery_service, "lifted_points", slow_lift)
    restarted = make_client(index_flush_interval_s=3600, pg_idle_in_transaction_timeout_ms=500)
    assert restarted.get("/healthz").status_code == 200
    assert top_ids(restarted, gallery_id, vectors[:3], k=2) == expected
