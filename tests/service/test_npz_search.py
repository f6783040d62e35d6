"""Issue 45 item 6: search answers as one ``.npz`` archive (``Accept: application/x-npz``),
searched in the NDJSON answer's chunks and spooled to disk, on real WordNet vectors (old: MiniLM
glosses), both databases and both vector engines."""

from __future__ import annotations

import errno
import io
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from app.client import Client
from app.search import npz_answer, service
from tests.service.conftest import TEST_KEY, problem, snapshot
from tests.service.test_backfill_api import N_GALLERY, reembed, upgraded
from tests.service.test_queries_api import NEW, OLD, npy
from tests.service.test_streamed_search import _json_hits

NPZ = {"Accept": "application/x-npz"}
HITS_PER_CHUNK = 50  # MAX_HITS_PER_REQUEST in these tests: 5 queries of k = 10 a chunk
MEMBERS = ["ids", "distances", "scores", "labels", "spaces", "counts"]


class Tracked(io.BufferedRandom):
    """A temporary file whose writes are recorded, and fail as on a full disk once
    ``temps.full_after`` bytes were written to it."""

    def __init__(self, directory: Path, temps: Temps) -> None:
        fd, name = tempfile.mkstemp(dir=directory, prefix="nobackfill-npz-")
        os.unlink(name)
        super().__init__(io.FileIO(fd, "r+"))
        self.writes: list[int] = []
        self.full_after = temps.full_after

    def write(self, data: Any) -> int:
        if self.full_after is not None and sum(self.writes) + len(data) > self.full_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.writes.append(len(data))
        return super().write(data)


class Temps(list):
    """The temporary files the answers opened, in order."""

    full_after: int | None = None


@pytest.fixture
def temps(monkeypatch) -> Temps:
    opened = Temps()

    def open_temp(directory: Path) -> Tracked:
        directory.mkdir(parents=True, exist_ok=True)
        opened.append(Tracked(directory, opened))
        return opened[-1]

    monkeypatch.setattr(npz_answer, "open_temp", open_temp)
    return opened


def _gallery(client: TestClient, wordnet_small, n: int = N_GALLERY, labelled: int = 0) -> str:
    """``n`` glosses, the first ``labelled`` of them with their lexname as label."""
    gallery = client.post(
        "/v1/galleries", json={"name": "g", "dim": 384, "model_name": OLD, "metric": "cosine"}
    ).json()
    ids, vectors = wordnet_small["synset_id"][:n], wordnet_small[f"gloss.{OLD}"][:n]
    for part, labels in ((slice(0, labelled), True), (slice(labelled, n), False)):
        if part.start == part.stop:
            continue
        files = {"ids": npy(ids[part]), "vectors": npy(vectors[part])}
        if labels:
            files["labels"] = npy(wordnet_small["lexname"][part])
        sent = client.post(f"/v1/galleries/{gallery['id']}/vectors", files=files)
        assert sent.status_code == 200, sent.text
    return gallery["id"]


def _load(response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-npz"
    assert int(response.headers["content-length"]) == len(response.content)
    with np.load(io.BytesIO(response.content), allow_pickle=False) as archive:
        assert archive.files == MEMBERS
        return {name: archive[name] for name in archive.files}


def _assert_same(arrays: dict[str, np.ndarray], rows: list[list[dict]], k: int) -> None:
    """The archive holds the JSON answer ``rows`` hit for hit, padded with "" and NaN."""
    n = len(rows)
    width = max(len(hit["id"]) for row in rows for hit in row)
    assert arrays["ids"].dtype == np.dtype(f"<U{width}")
    for name in ("distances", "scores"):
        assert arrays[name].dtype == np.float64 and arrays[name].shape == (n, k)
    assert arrays["counts"].tolist() == [len(row) for row in rows]
    for q, row in enumerate(rows):
        c = len(row)
        assert arrays["ids"][q, :c].tolist() == [hit["id"] for hit in row]
        assert arrays["distances"][q, :c].tolist() == [hit["distance"] for hit in row]
        assert arrays["scores"][q, :c].tolist() == [hit["score"] for hit in row]
        assert arrays["labels"][q, :c].tolist() == [hit.get("label", "") for hit in row]
        assert arrays["spaces"][q, :c].tolist() == [hit.get("space", "") for hit in row]
        for name in ("ids", "labels", "spaces"):
            assert (arrays[name][q, c:] == "").all()
        assert (
            np.isnan(arrays["distances"][q, c:]).all() and np.isnan(arrays["scores"][q, c:]).all()
        )


def _closed(temps: Temps, data_dir: Path) -> None:
    """Every temporary file the answers opened is closed, and none has a name left."""
    assert all(file.closed for file in temps)
    assert not [p for p in data_dir.rglob("*") if p.name.startswith("nobackfill-npz-")]


def test_an_answer_past_the_json_limit_is_an_npz_equal_to_json(
    make_client, wordnet_small, temps
) -> None:
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    url = f"/v1/galleries/{_gallery(client, wordnet_small, labelled=150)}/search"
    queries = wordnet_small[f"lemma.{OLD}"][:23]
    body = {"vectors": queries.tolist(), "k": 10}
    assert problem(client.post(url, json=body), 422)["errors"][0]["field"] == "k"
    answer = client.post(url, json=body, headers=NPZ)
    arrays = _load(answer)
    assert len(temps) == 2  # the spool and the archive
    rows = _json_hits(client, url, body, 23)
    assert any("label" in hit for row in rows for hit in row)  # labelled and unlabelled hits
    assert any("label" not in hit for row in rows for hit in row)
    _assert_same(arrays, rows, 10)
    # A .npy body answers the same archive, byte for byte.
    npy_body = client.post(
        f"{url}?k=10", content=npy(queries)[1], headers=NPZ | {"Content-Type": "application/x-npy"}
    )
    assert npy_body.content == answer.content
    # JSON stays the default; whichever of JSON and .npz comes first in Accept wins.
    for accept, media in (
        ("*/*", "application/json"),
        ("application/json, application/x-npz", "application/json"),
        ("application/x-npz, application/json", "application/x-npz"),
        ("application/x-ndjson, application/x-npz", "application/x-ndjson"),
    ):
        small = client.post(url, json={"vectors": queries[:3].tolist()}, headers={"Accept": accept})
        assert small.headers["content-type"].startswith(media), accept
    _closed(temps, client.app.state.service.settings.data_dir)


def test_a_bridged_and_a_transition_search_answer_npz_equal_to_json(
    make_client, wordnet_small
) -> None:
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    setup = upgraded(client, wordnet_small)
    reembedded = [str(i) for i in wordnet_small["synset_id"][:60]]
    assert reembed(client, setup, wordnet_small, reembedded).status_code == 200
    url = f"/v1/galleries/{setup['gallery_id']}/search"
    bridged = {
        "model_id": setup["model_id"],
        "features": wordnet_small[f"lemma.{NEW}"][:12].tolist(),
        "k": 10,
    }
    transition = bridged | {"old_vectors": wordnet_small[f"lemma.{OLD}"][:12].tolist()}
    for body in (bridged, transition):
        answer = client.post(url, json=body, headers=NPZ)
        arrays = _load(answer)
        rows = _json_hits(client, url, body, 12)
        _assert_same(arrays, rows, 10)
        # Both spaces in one answer: items re-embedded for the model and items not.
        assert {"old", "new"} <= set(arrays["spaces"].ravel().tolist())
        first = client.post(
            url, json={key: v[:5] if isinstance(v, list) else v for key, v in body.items()}
        )
        assert first.status_code == 200, first.text
        warning = "X-Nobackfill-Warning"
        assert answer.headers.get(warning) == first.headers.get(warning)


def test_a_gallery_smaller_than_k_pads_and_the_client_reads_the_archive(
    make_client, wordnet_small
) -> None:
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    gallery_id = _gallery(client, wordnet_small, n=7, labelled=3)
    url = f"/v1/galleries/{gallery_id}/search"
    queries = wordnet_small[f"lemma.{OLD}"][:9]
    arrays = _load(client.post(url, json={"vectors": queries.tolist(), "k": 12}, headers=NPZ))
    assert arrays["ids"].shape == (9, 12) and arrays["counts"].tolist() == [7] * 9
    assert (arrays["ids"][:, 7:] == "").all() and np.isnan(arrays["scores"][:, 7:]).all()
    assert sorted(arrays["ids"][0, :7].tolist()) == sorted(wordnet_small["synset_id"][:7].tolist())
    _assert_same(arrays, _json_hits(client, url, {"vectors": queries.tolist(), "k": 12}, 9, 4), 12)
    # The Python client: the archive's arrays, batches concatenated, equal to its JSON search.
    api = Client("http://testserver", TEST_KEY, transport=client._transport, batch_rows=4)
    got = api.search_npz(gallery_id, queries, 12)
    assert list(got) == MEMBERS
    for name in MEMBERS:
        np.testing.assert_array_equal(got[name], arrays[name])  # NaN equal to NaN
    found = api.search(gallery_id, queries, 12)
    assert got["ids"].tolist() == found.ids.tolist()
    assert got["labels"].tolist() == found.labels.tolist()
    np.testing.assert_array_equal(got["distances"], found.distances)


@pytest.mark.sqlite_only
def test_what_a_request_gets_wrong_is_a_problem_and_nothing_is_left_on_disk(
    make_client, wordnet_small, temps
) -> None:
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    url = f"/v1/galleries/{_gallery(client, wordnet_small)}/search"
    before = snapshot(client)
    rows = wordnet_small[f"lemma.{OLD}"][:8].tolist()
    missing = client.post("/v1/galleries/gal_nope/search", json={"vectors": rows}, headers=NPZ)
    assert problem(missing, 404)
    narrow = client.post(url, json={"vectors": [r[:5] for r in rows]}, headers=NPZ)
    assert problem(narrow, 422)
    too_big_k = client.post(url, json={"vectors": rows, "k": 5000}, headers=NPZ)
    assert problem(too_big_k, 422)["errors"][0]["field"] == "k"
    rerank = {"model_id": "mdl_x", "features": rows, "rerank": {}}
    assert problem(client.post(url, json=rerank, headers=NPZ), 406)
    assert snapshot(client) == before
    assert temps == []  # the first chunk is searched before any file is opened


@pytest.mark.faiss_only
@pytest.mark.sqlite_only
def test_a_failure_after_the_first_chunk_or_a_full_disk_is_a_problem_with_its_status(
    make_client, wordnet_small, temps, monkeypatch
) -> None:
    """Every chunk is searched before the answer starts: a database lost at the third chunk is
    a 503, a disk full while spooling a 507, and every temporary file is closed."""
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    url = f"/v1/galleries/{_gallery(client, wordnet_small)}/search"
    body = {"vectors": wordnet_small[f"lemma.{OLD}"][:20].tolist(), "k": 10}
    real = service.search_gallery
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OperationalError("SELECT", {}, Exception("could not connect to server"))
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "search_gallery", failing)
    assert problem(client.post(url, json=body, headers=NPZ), 503)
    monkeypatch.setattr(service, "search_gallery", real)
    data_dir = client.app.state.service.settings.data_dir
    _closed(temps, data_dir)

    temps.full_after = 10_000
    opened = len(temps)
    full = problem(client.post(url, json=body, headers=NPZ), 507)
    assert "data directory" in full["detail"]
    assert len(temps) > opened
    _closed(temps, data_dir)


@pytest.mark.sqlite_only
def test_the_spool_holds_one_chunk_and_writes_bounded_pieces(
    make_client, wordnet_small, temps, monkeypatch
) -> None:
    """Memory: the search sees chunks of at most MAX_HITS_PER_REQUEST hits, the spool one chunk
    at a time, and every array written (to the spool, then widened into the archive) is at most
    PIECE_BYTES."""
    piece = 4096
    monkeypatch.setattr(npz_answer, "PIECE_BYTES", piece)
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    url = f"/v1/galleries/{_gallery(client, wordnet_small, labelled=400)}/search"
    searched: list[int] = []
    spooled: list[int] = []
    real_search, real_add = service.search_gallery, npz_answer.Spool.add

    def search(*args, **kwargs):
        searched.append(len(args[6].vectors) * args[6].k)
        return real_search(*args, **kwargs)

    def add(self, results):
        spooled.append(sum(len(hits) for hits in results))
        return real_add(self, results)

    monkeypatch.setattr(service, "search_gallery", search)
    monkeypatch.setattr(npz_answer.Spool, "add", add)
    body = {"vectors": wordnet_small[f"lemma.{OLD}"][:23].tolist(), "k": 10}
    arrays = _load(client.post(url, json=body, headers=NPZ))
    assert searched == [50, 50, 50, 50, 30] and spooled == searched
    spool, archive = temps[-2:]
    assert len(spool.writes) > 6 * len(searched) and max(spool.writes) <= piece
    assert max(archive.writes) <= piece and len(archive.writes) > 4 * len(MEMBERS)
    monkeypatch.setattr(service, "search_gallery", real_search)
    _assert_same(arrays, _json_hits(client, url, body, 23), 10)


def test_the_archive_is_closed_when_the_client_goes_away(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(npz_answer, "READ_BYTES", 64)
    hits = [[{"id": f"item-{i}", "distance": 0.5 * i, "score": -float(i)} for i in range(3)]]
    archive = npz_answer.build(iter([hits * 4, hits[:1]]), tmp_path, 3)
    assert archive.size > 64 * 4
    pieces = archive.pieces()
    assert len(next(pieces)) == 64
    pieces.close()  # what the server does with the body of an answer its client left
    assert archive.file.closed
    assert list(tmp_path.iterdir()) == []


def test_widening_a_chunk_to_the_answers_widths_keeps_pieces_bounded(
    tmp_path: Path, temps: Temps, monkeypatch
) -> None:
    """A chunk spooled with one-letter ids, then one whose id is long: the first chunk's rows,
    widened in the archive, are still written a piece of at most PIECE_BYTES at a time."""
    piece = 2048
    monkeypatch.setattr(npz_answer, "PIECE_BYTES", piece)
    short = [[{"id": "a", "distance": 1.0, "score": 0.5, "label": "x"}] * 2] * 200
    long = [[{"id": "b" * 200, "distance": 2.0, "score": 0.25, "space": "old"}]]
    archive = npz_answer.build(iter([short, long]), tmp_path, 2)
    with np.load(archive.file, allow_pickle=False) as loaded:
        arrays = {name: loaded[name] for name in loaded.files}
    archive.close()
    assert arrays["ids"].dtype == np.dtype("<U200") and arrays["ids"].shape == (201, 2)
    assert (arrays["ids"][:200] == "a").all() and arrays["ids"][200].tolist() == ["b" * 200, ""]
    assert arrays["counts"].tolist() == [2] * 200 + [1]
    assert arrays["spaces"][200].tolist() == ["old", ""] and (arrays["spaces"][:200] == "").all()
    spool, written = temps
    assert max(spool.writes) <= piece and max(written.writes) <= piece
    assert sum(written.writes) > 200 * 2 * 200 * 4  # the ids alone, widened


@pytest.mark.sqlite_only
def test_an_answer_past_max_npz_answer_bytes_is_a_413_before_or_while_it_is_spooled(
    make_client, wordnet_small, temps
) -> None:
    """The answer's size is bounded (issue 45 item 6): before any work by the least it can take
    (one-character strings), then after each chunk by the widths seen; either way a 413 naming
    the setting, with nothing changed and nothing left on disk. Just under the bound it answers."""
    queries = wordnet_small[f"lemma.{OLD}"][:20].tolist()
    k = 10
    widths = {"ids": 1, "labels": 1, "spaces": 1}
    least = npz_answer.archive_bytes(len(queries), k, widths)
    client = make_client(max_hits_per_request=HITS_PER_CHUNK, max_npz_answer_bytes=least - 1)
    url = f"/v1/galleries/{_gallery(client, wordnet_small)}/search"
    before = snapshot(client)
    early = problem(client.post(url, json={"vectors": queries, "k": k}, headers=NPZ), 413)
    assert "MAX_NPZ_ANSWER_BYTES" in early["detail"] and early["errors"][0]["field"] == "k"
    assert temps == []  # refused before the first chunk was searched
    # The ids are wider than one character: the projection after the first chunk passes a bound
    # the least size clears.
    ids = wordnet_small["synset_id"][:N_GALLERY]
    widths["ids"] = max(len(i) for i in ids)
    real = npz_answer.archive_bytes(len(queries), k, widths)
    assert real > least
    data_dir = client.app.state.service.settings.data_dir
    client = make_client(max_hits_per_request=HITS_PER_CHUNK, max_npz_answer_bytes=real - 1)
    late = problem(client.post(url, json={"vectors": queries, "k": k}, headers=NPZ), 413)
    assert "MAX_NPZ_ANSWER_BYTES" in late["detail"]
    assert len(temps) == 1  # the spool, opened for the first chunk and closed
    _closed(temps, data_dir)
    assert snapshot(client) == before
    client = make_client(max_hits_per_request=HITS_PER_CHUNK, max_npz_answer_bytes=real)
    arrays = _load(client.post(url, json={"vectors": queries, "k": k}, headers=NPZ))
    assert arrays["ids"].shape == (len(queries), k)
    # The answer sent is tallied as returned (the refused ones were not).
    returned = {i for i in arrays["ids"].ravel().tolist() if i}
    assert snapshot(client)["gallery_returned"] == len(returned)
