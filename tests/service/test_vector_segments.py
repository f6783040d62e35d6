"""Segment-file vector storage behind the API: no SQL row per vector, restarts lose nothing, a
tail no committed manifest covers is cut off, damage inside the committed part is reported (never
read as data), a write that fails before its commit leaves nothing visible, compaction keeps ids,
and galleries stored as SQL rows keep working beside segment ones."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete as sql_delete
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.galleries import service as gallery_service
from app.galleries.models import Gallery
from app.vectors.faiss import segments
from app.vectors.tables import GalleryVector
from tests.service.conftest import problem, snapshot, stop_client
from tests.service.test_durability import top_ids
from tests.service.test_galleries_api import make_gallery, seed_vectors

pytestmark = pytest.mark.faiss_only(
    "segment and SQL-row storage, which Milvus galleries do not use"
)


def segment_files(client: TestClient, gallery_id: str) -> list[Path]:
    directory = client.app.state.service.settings.data_dir / "vectors" / gallery_id
    return sorted(directory.glob("*.seg"))


def manifest(client: TestClient, gallery_id: str) -> dict:
    with client.app.state.service.db.session() as session:
        gallery = session.get(Gallery, gallery_id)
        return {"storage": gallery.vector_storage, **(gallery.vector_manifest or {})}


def read(client: TestClient, gallery_id: str, ids: list[str]) -> dict:
    response = client.get(f"/v1/galleries/{gallery_id}/vectors", params={"ids": ids})
    assert response.status_code == 200, response.text
    return response.json()


def sql_rows(client: TestClient) -> int:
    with client.app.state.service.db.session() as session:
        return session.scalar(select(func.count()).select_from(GalleryVector))


def test_vectors_live_in_segments_and_survive_a_restart(make_client) -> None:
    client = make_client()
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id)
    changed = client.post(
        f"/v1/galleries/{gallery_id}/vectors",
        json={"ids": ["item-3"], "vectors": [[1.0, 2.0, 3.0, 4.0]], "metadata": [{"k": "v"}]},
    )
    assert changed.status_code == 200, changed.text
    gone = client.request("DELETE", f"/v1/galleries/{gallery_id}/vectors", json={"ids": ["item-5"]})
    assert gone.json() == {"deleted": 1, "count": 19}
    assert sql_rows(client) == 0
    stored = manifest(client, gallery_id)
    assert stored["storage"] == "segments" and stored["version"] == 3
    [file] = segment_files(client, gallery_id)
    assert file.stat().st_size == stored["segments"][0]["bytes"]
    before = read(client, gallery_id, ["item-3", "item-0", "item-19"])
    expected = top_ids(client, gallery_id, vectors[:4])
    state = snapshot(client)
    stop_client(client)

    restarted = make_client()
    assert snapshot(restarted) == state
    assert read(restarted, gallery_id, ["item-3", "item-0", "item-19"]) == before
    assert before["vectors"][0] == [1.0, 2.0, 3.0, 4.0] and before["metadata"][0] == {"k": "v"}
    np.testing.assert_allclose(before["vectors"][1], vectors[0])
    assert before["labels"][1:] == ["class-0", "class-1"]
    assert top_ids(restarted, gallery_id, vectors[:4]) == expected
    missing = restarted.get(f"/v1/galleries/{gallery_id}/vectors", params={"ids": ["item-5"]})
    problem(missing, 404)


def test_a_tail_beyond_the_committed_manifest_is_cut_off(make_client, caplog) -> None:
    client = make_client()
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    before = read(client, gallery_id, [f"item-{i}" for i in range(20)])
    [file] = segment_files(client, gallery_id)
    committed = file.stat().st_size
    stray = file.parent / "00000099.seg"
    stop_client(client)
    # What a write killed between its fsync and its commit leaves: bytes past the committed end
    # (here the start of a real batch, torn) and a new segment no manifest names.
    with open(file, "ab") as fh:
        fh.write(file.read_bytes()[:100])
    stray.write_bytes(b"NBSG")

    with caplog.at_level(logging.WARNING):
        restarted = make_client()
    assert file.stat().st_size == committed and not stray.exists()
    assert "cut 100 uncommitted bytes" in caplog.text
    assert read(restarted, gallery_id, [f"item-{i}" for i in range(20)]) == before
    more = restarted.post(
        f"/v1/galleries/{gallery_id}/vectors", json={"ids": ["new"], "vectors": [[0, 1, 0, 0]]}
    )
    assert more.status_code == 200 and more.json()["count"] == 21


def test_damage_inside_the_committed_part_is_reported(make_client, caplog) -> None:
    client = make_client()
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    [file] = segment_files(client, gallery_id)
    stop_client(client)
    data = bytearray(file.read_bytes())
    data[-20] ^= 0x01  # one bit of the last vector
    file.write_bytes(bytes(data))

    with caplog.at_level(logging.ERROR):
        restarted = make_client()
    assert "checksum mismatch" in caplog.text
    assert f"gallery {gallery_id}" in caplog.text
    response = restarted.get(f"/v1/galleries/{gallery_id}/vectors", params={"ids": ["item-19"]})
    problem(response, 500)
    search = restarted.post(
        f"/v1/galleries/{gallery_id}/search", json={"vectors": [[1, 0, 0, 0]], "k": 1}
    )
    problem(search, 500)


def test_a_write_that_fails_before_its_commit_leaves_nothing(make_client, monkeypatch) -> None:
    client = make_client()
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    before = snapshot(client)
    [file] = segment_files(client, gallery_id)
    committed = file.stat().st_size

    def fail(*args, **kwargs) -> None:
        raise RuntimeError("killed between the append and the commit")

    monkeypatch.setattr(gallery_service, "_forget_reembedded", fail)
    response = client.post(
        f"/v1/galleries/{gallery_id}/vectors",
        json={"ids": ["item-0", "late"], "vectors": [[9, 9, 9, 9], [1, 1, 1, 1]]},
    )
    assert response.status_code == 500
    assert file.stat().st_size > committed  # appended and fsynced, never committed
    monkeypatch.undo()
    after = snapshot(client)
    assert {k: v for k, v in after.items() if k != "vector_files"} == {
        k: v for k, v in before.items() if k != "vector_files"
    }
    problem(client.get(f"/v1/galleries/{gallery_id}/vectors", params={"ids": ["late"]}), 404)
    old = read(client, gallery_id, ["item-0"])["vectors"][0]
    assert old != [9, 9, 9, 9]
    # The next write starts at the committed end: the uncommitted batch is overwritten.
    ok = client.post(
        f"/v1/galleries/{gallery_id}/vectors", json={"ids": ["late"], "vectors": [[1, 0, 0, 0]]}
    )
    assert ok.status_code == 200 and ok.json()["count"] == 21
    assert file.stat().st_size == manifest(client, gallery_id)["segments"][0]["bytes"]
    stop_client(client)
    restarted = make_client()
    assert read(restarted, gallery_id, ["item-0"])["vectors"][0] == old
    assert restarted.get(f"/v1/galleries/{gallery_id}").json()["count"] == 21


def test_compaction_rewrites_live_items_and_keeps_their_ids(make_client, monkeypatch) -> None:
    monkeypatch.setattr(segments, "COMPACT_MIN_DEAD", 30)
    client = make_client()
    gallery_id = make_gallery(client)
    rng = np.random.default_rng(1)
    ids = [f"item-{i}" for i in range(20)]
    for round_no in range(4):
        vectors = rng.normal(size=(20, 4)).astype(np.float32)
        response = client.post(
            f"/v1/galleries/{gallery_id}/vectors",
            json={"ids": ids, "vectors": vectors.tolist(), "labels": [str(round_no)] * 20},
        )
        assert response.status_code == 200, response.text
        internal = client.app.state.service.indexes._indexes[gallery_id][1].ids.copy()
        if round_no == 0:
            first_ids = internal
        np.testing.assert_array_equal(np.sort(internal), np.sort(first_ids))
    stored = manifest(client, gallery_id)
    # 80 records for 20 live items: compacted once dead records passed 30 and the live count.
    assert len(stored["segments"]) == 1 and stored["segments"][0]["records"] < 80
    got = read(client, gallery_id, ids)
    np.testing.assert_allclose(got["vectors"], vectors)
    assert got["labels"] == ["3"] * 20
    assert top_ids(client, gallery_id, vectors[:3], k=1) == [[i] for i in ids[:3]]
    # The replaced segment is deleted by the next write (after the compaction committed).
    client.request("DELETE", f"/v1/galleries/{gallery_id}/vectors", json={"ids": ["item-0"]})
    assert [f.name for f in segment_files(client, gallery_id)] == [
        s["name"] for s in manifest(client, gallery_id)["segments"]
    ]
    stop_client(client)
    restarted = make_client()
    assert read(restarted, gallery_id, ids[1:])["vectors"] == got["vectors"][1:]


def test_sql_galleries_keep_working_beside_segment_ones(make_client) -> None:
    old = make_client(vector_storage="sql")
    sql_gallery = make_gallery(old, name="rows")
    vectors = seed_vectors(old, sql_gallery)
    assert sql_rows(old) == 20
    stop_client(old)

    client = make_client()
    assert manifest(client, sql_gallery)["storage"] == "sql"
    seg_gallery = make_gallery(client, name="segments")
    seed_vectors(client, seg_gallery)
    assert manifest(client, seg_gallery)["storage"] == "segments"
    assert sql_rows(client) == 20  # the new gallery wrote no row
    assert top_ids(client, sql_gallery, vectors[:2], k=1) == [["item-0"], ["item-1"]]
    assert top_ids(client, seg_gallery, vectors[:2], k=1) == [["item-0"], ["item-1"]]
    gone = client.request(
        "DELETE", f"/v1/galleries/{sql_gallery}/vectors", json={"ids": ["item-0"]}
    )
    assert gone.json() == {"deleted": 1, "count": 19}
    assert client.delete(f"/v1/galleries/{seg_gallery}").status_code == 204
    assert segment_files(client, seg_gallery) == []


@pytest.mark.parametrize("storage", ["sql", "segments"])
def test_the_setting_picks_the_storage_of_new_galleries(make_client, storage: str) -> None:
    client = make_client(vector_storage=storage)
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    assert manifest(client, gallery_id)["storage"] == storage
    assert sql_rows(client) == (20 if storage == "sql" else 0)
    assert bool(segment_files(client, gallery_id)) == (storage == "segments")


def test_two_servers_on_one_data_dir_lose_no_write(make_client) -> None:
    """Two API processes on one data dir (here two apps, each with its own index locks): their
    writers are serialised by the database (row lock, or SQLite's write lock), so neither appends
    at a segment end the other has already moved."""
    first, second = make_client(), make_client()
    gallery_id = make_gallery(first)
    rng = np.random.default_rng(2)

    def ingest(client: TestClient, prefix: str) -> list[str]:
        sent = []
        for batch in range(6):
            ids = [f"{prefix}-{batch}-{i}" for i in range(30)]
            vectors = rng.normal(size=(30, 4)).astype(np.float32)
            response = client.post(
                f"/v1/galleries/{gallery_id}/vectors",
                json={"ids": ids, "vectors": vectors.tolist()},
            )
            assert response.status_code == 200, response.text
            sent += ids
        return sent

    with ThreadPoolExecutor(2) as pool:
        sent = [
            f.result()
            for f in [pool.submit(ingest, c, p) for c, p in ((first, "a"), (second, "b"))]
        ]
    stop_client(first)
    stop_client(second)
    restarted = make_client()
    assert restarted.get(f"/v1/galleries/{gallery_id}").json()["count"] == 360
    for ids in sent:
        assert read(restarted, gallery_id, ids)["ids"] == ids


def test_a_full_segment_rolls_over_to_the_next(make_client, monkeypatch) -> None:
    monkeypatch.setattr(segments, "SEGMENT_MAX_BYTES", 2000)
    client = make_client()
    gallery_id = make_gallery(client)
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(60, 4)).astype(np.float32)
    ids = [f"item-{i}" for i in range(60)]
    for start in range(0, 60, 10):
        response = client.post(
            f"/v1/galleries/{gallery_id}/vectors",
            json={"ids": ids[start : start + 10], "vectors": vectors[start : start + 10].tolist()},
        )
        assert response.status_code == 200, response.text
    stored = manifest(client, gallery_id)
    assert len(stored["segments"]) > 1
    assert [f.name for f in segment_files(client, gallery_id)] == [
        s["name"] for s in stored["segments"]
    ]
    stop_client(client)
    restarted = make_client()
    np.testing.assert_allclose(read(restarted, gallery_id, ids[::-1])["vectors"], vectors[::-1])
    assert top_ids(restarted, gallery_id, vectors[::7], k=1) == [[i] for i in ids[::7]]


def test_a_reader_holding_an_older_manifest_survives_another_process_compacting(
    make_client, monkeypatch
) -> None:
    """A Celery worker reads a gallery with the manifest it loaded (and its own in-memory maps)
    while the API compacts the gallery and a later write deletes the replaced segment. The
    worker's next read finds the file gone: it re-reads the committed manifest and answers from
    it, instead of failing the job."""
    monkeypatch.setattr(segments, "COMPACT_MIN_DEAD", 30)
    client = make_client()
    gallery_id = make_gallery(client)
    db = client.app.state.service.db
    rng = np.random.default_rng(3)
    ids = [f"item-{i}" for i in range(20)]

    def write(round_no: int) -> np.ndarray:
        vectors = rng.normal(size=(20, 4)).astype(np.float32)
        response = client.post(
            f"/v1/galleries/{gallery_id}/vectors",
            json={"ids": ids, "vectors": vectors.tolist(), "labels": [str(round_no)] * 20},
        )
        assert response.status_code == 200, response.text
        return vectors

    write(0)
    # The worker's process: its own storage object (own maps) on the shared data dir.
    root = client.app.state.service.settings.data_dir / "vectors"
    worker, fresh_worker = segments.SegmentVectorStorage(root), segments.SegmentVectorStorage(root)
    with db.session() as session:
        stale = session.get(Gallery, gallery_id)
        session.expunge(stale)
    with db.session() as session:
        assert worker.fetch(session, stale, ids[:2]).item_ids == ids[:2]
    for round_no in range(1, 4):
        latest = write(round_no)
    first_segment = stale.vector_manifest["segments"][0]["name"]
    assert first_segment not in [f.name for f in segment_files(client, gallery_id)]
    for storage in (worker, fresh_worker):
        with db.session() as session:
            got = storage.fetch(session, stale, ids)
            np.testing.assert_allclose(got.vectors, latest)
            assert got.labels == ["3"] * 20
            scanned = list(storage.scan(session, stale))
            assert sum(len(part.ids) for part in scanned) == 20
            assert storage.count(session, stale) == 20
    # Damage is still damage: a segment the newest manifest names, gone, is reported.
    for path in segment_files(client, gallery_id):
        path.unlink()
    with db.session() as session, pytest.raises(segments.SegmentCorrupted, match="missing"):
        segments.SegmentVectorStorage(root).fetch(session, stale, ids)


PROBE = [[0.5, -4.0, 2.5, 1.0]]


@contextmanager
def search_behind_a_write(client: TestClient) -> Iterator[tuple[Session, Gallery, Callable]]:
    """(a session, the gallery row it read, a search through it): the row was read before an
    upload of item ``written`` at ``PROBE`` committed, so the index in memory is newer."""
    from app.search import service as search_service
    from app.search.schemas import SearchRequest

    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    state = client.app.state.service
    assert client.post(f"/v1/galleries/{gallery_id}/search", json={"vectors": PROBE}).is_success
    with state.db.session() as reader:
        behind = reader.get(Gallery, gallery_id)
        tenant_id, version = behind.tenant_id, behind.index_version
        written = client.post(
            f"/v1/galleries/{gallery_id}/vectors", json={"ids": ["written"], "vectors": PROBE}
        )
        assert written.status_code == 200, written.text
        assert state.indexes.current_version(gallery_id) == version + 1

        def search() -> list:
            query = SearchRequest(vectors=PROBE, k=3)
            return search_service.search_gallery(
                reader, state.settings, state.indexes, state.models, tenant_id, behind, query
            )

        yield reader, behind, search


def test_a_search_that_read_the_gallery_before_a_write_finds_the_written_item(
    make_client, caplog: pytest.LogCaptureFixture
) -> None:
    """A search holds the gallery row it read before a concurrent write committed: it searches
    the newer index in memory (no rebuild from the stored vectors) and names the written item,
    whose name it looks up through the newer manifest."""
    client = make_client()
    with search_behind_a_write(client) as (_, behind, search):
        version = behind.index_version
        with caplog.at_level(logging.INFO, logger="app.vectors.faiss.index_store"):
            hits = search()
        assert hits[0][0]["id"] == "written", hits
        assert not [r for r in caplog.records if "rebuilt" in r.getMessage()]
        assert client.app.state.service.indexes.current_version(behind.id) == version + 1


def test_a_search_behind_a_write_of_a_gallery_deleted_elsewhere_is_404(make_client) -> None:
    """Another process deleted the gallery after this search read it, and this process's index
    is newer than the row the search holds: the search answers 404 as a later request would."""
    from app.core.errors import Problem

    client = make_client()
    with search_behind_a_write(client) as (_, behind, search):
        with client.app.state.service.db.session() as other_process:
            other_process.execute(sql_delete(Gallery).where(Gallery.id == behind.id))
            other_process.commit()
        with pytest.raises(Problem) as caught:
            search()
        assert caught.value.status == 404
