"""Attaching a Milvus collection as a gallery (issue 27, item 1, Milvus), on milvus-lite files, and
for a representative subset (``ON_BOTH``: attach, reads, a search before and after an upgrade
trained from the collection, the owner's changes seen) on a real Milvus server too (Milvus 2.3.5
standalone, ``tests/service/milvus_server.py``; the collection is built there instead of in a
file, and the settings allow the server's URL).

The collection is built from real vectors (tests/fixtures/wordnet_small.npz: old = MiniLM
glosses, new = mpnet glosses) by a client that is closed before the service opens the file
(milvus-lite locks it to one process), under its own field names and a FLAT COSINE index. The
attached gallery must search like the same vectors uploaded as an ordinary gallery, train
upgrades from the collection, follow the owner's changes, and never write to it.

Attached galleries keep no vector in the FAISS or Milvus engine, so the tests run on both SQL
backends with FAISS only (``faiss_only``); the copied gallery they compare with is a FAISS one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pymilvus import DataType, MilvusClient
from pymilvus.exceptions import MilvusUnavailableException

from app.core.errors import Problem
from app.core.settings import Settings
from app.galleries.attach import attach_gallery
from app.galleries.schemas import GalleryCreate
from app.vectors.milvus.engine import is_remote
from app.vectors.milvus.source import MilvusSource, close_connections, connection
from tests.service.conftest import problem, snapshot, stop_client
from tests.service.milvus_server import (  # noqa: F401  (milvus_server_uri: the fixture)
    dropped_after,
    milvus_server_uri,
)
from tests.service.test_qdrant_attach import (
    attach,
    copied_gallery,
    paired_dataset,
    searches_like_the_copied_gallery,
    top_ids,
    upgrade_on,
)

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")

OLD, NEW = "gloss.all-MiniLM-L6-v2", "gloss.all-mpnet-base-v2"
N = 300  # rows in the collection
SOURCE = {
    "engine": "milvus",
    "uri": "nouns.db",
    "collection": "nouns",
    "id_field": "doc_id",
    "vector_field": "embedding",
}


def milvus_root(tmp_path: Path, tenant: str = "local") -> Path:
    """The tenant's folder (the local tenant's: ``local``) under the service's default Milvus
    attach root in the tests' data dir (``make_settings``)."""
    return tmp_path / "data" / "milvus-attach" / tenant


# The tests of the real-server subset (see the module docstring).
ON_BOTH = pytest.mark.parametrize("place", ["lite", "server"], indirect=True)


@pytest.fixture
def place(request: pytest.FixtureRequest) -> str:
    """Where the owner's collections live: ``lite`` (milvus-lite files in the tenant's attach
    folder) unless a test is parametrized ``server`` (the shared Milvus server)."""
    return str(getattr(request, "param", "lite"))


@pytest.fixture
def attach_source(place: str, request: pytest.FixtureRequest) -> Iterator[dict]:
    """``SOURCE`` where the place is: on the server its URI names it (the collections a test
    made there are dropped after it). Not ``source``: tests take that name as a parameter."""
    if place == "lite":
        yield SOURCE
        return
    if request.getfixturevalue("backend") != "sqlite":
        # The SQL backend changes nothing the server is asked; half the server time saved.
        pytest.skip("the real-server variant runs on SQLite only")
    uri = request.getfixturevalue("milvus_server_uri")
    with dropped_after(uri):
        yield {**SOURCE, "uri": uri}


@pytest.fixture
def make_settings(
    make_settings: Callable[..., Settings], attach_source: dict
) -> Callable[..., Settings]:
    """The conftest's settings, allowing the server the source names, if any."""
    if not is_remote(attach_source["uri"]):
        return make_settings
    allowed = {"milvus_allowed_urls": [attach_source["uri"]]}
    return lambda **overrides: make_settings(**(allowed | overrides))


def built_at(tmp_path: Path, source: dict, file: str) -> Path | str:
    """Where ``build_collection`` makes a collection ``source`` attaches: the server, or the
    tenant's ``file``."""
    return source["uri"] if is_remote(source["uri"]) else milvus_root(tmp_path) / file


def build_collection(
    where: Path | str,
    name: str,
    vectors: np.ndarray,
    ids: list[int] | list[str],
    *,
    metric: str = "COSINE",
) -> None:
    """A collection of ``vectors`` as a team would make it (its own field names, a title, a
    FLAT index, the default consistency), closed again: the service opens the file next. On a
    server URI, there."""
    if isinstance(where, Path):
        where.parent.mkdir(parents=True, exist_ok=True)
        client = MilvusClient(str(where))
    else:
        client = MilvusClient(uri=where)
    schema = client.create_schema(auto_id=False)
    if isinstance(ids[0], str):
        schema.add_field("doc_id", DataType.VARCHAR, is_primary=True, max_length=64)
    else:
        schema.add_field("doc_id", DataType.INT64, is_primary=True)
    schema.add_field("title", DataType.VARCHAR, max_length=64)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=vectors.shape[1])
    index = client.prepare_index_params()
    index.add_index("embedding", index_type="FLAT", metric_type=metric)
    client.create_collection(name, schema=schema, index_params=index)
    client.insert(
        name,
        [
            {"doc_id": i, "title": f"row {n}", "embedding": v.tolist()}
            for n, (i, v) in enumerate(zip(ids, vectors, strict=True))
        ],
    )
    client.close()


@contextmanager
def owner(client: TestClient, source: dict = SOURCE) -> Iterator[MilvusClient]:
    """The service's own client of the file (milvus-lite: one process) or server, standing in
    for the collection's owner."""
    settings = client.app.state.service.settings
    with connection(settings, MilvusSource.of({**source, "folder": "local"})).use() as milvus:
        yield milvus


def rows_of(milvus: MilvusClient, name: str) -> list[tuple]:
    # Strong: on a server the collection's default (Bounded) may not show the latest writes yet.
    rows = milvus.query(
        name,
        filter="",
        output_fields=["doc_id", "title", "embedding"],
        limit=9999,
        consistency_level="Strong",
    )
    return sorted((r["doc_id"], r["title"], tuple(r["embedding"])) for r in rows)


@pytest.fixture
def nouns(tmp_path: Path, wordnet_small: dict, attach_source: dict) -> dict:
    """A collection ``nouns`` of N old vectors with INT64 keys 0…N−1 (item ids "0"…), where
    ``attach_source`` attaches it."""
    old = wordnet_small[OLD][:N]
    build_collection(built_at(tmp_path, attach_source, "nouns.db"), "nouns", old, list(range(N)))
    return {"old": old, "new": wordnet_small[NEW][:N], "ids": [str(i) for i in range(N)]}


@ON_BOTH
def test_attach_takes_dimension_metric_and_count_from_the_collection(
    client: TestClient, nouns: dict, attach_source: dict
) -> None:
    gallery = attach(client, attach_source)
    assert (gallery["dim"], gallery["metric"], gallery["count"]) == (384, "cosine", N)
    # A milvus-lite file is recorded with the tenant's folder it lies in; a server is not.
    assert gallery["source"] == {
        **attach_source,
        "metric": "COSINE",
        "id_type": "INT64",
        **({} if is_remote(attach_source["uri"]) else {"folder": "local"}),
    }
    assert client.get(f"/v1/galleries/{gallery['id']}").json()["count"] == N
    found = client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ["7", "3"]})
    assert found.status_code == 200, found.text
    # Milvus keeps the vectors as written.
    np.testing.assert_allclose(found.json()["vectors"], nouns["old"][[7, 3]], rtol=1e-6)
    missing = problem(
        client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ["7", "x", "400"]}),
        404,
    )
    assert [e["field"] for e in missing["errors"]] == ["ids[1]", "ids[2]"]


def test_writes_to_an_attached_gallery_are_refused_and_change_nothing(
    client: TestClient, nouns: dict
) -> None:
    gallery = attach(client, SOURCE)
    url = f"/v1/galleries/{gallery['id']}/vectors"
    with owner(client) as milvus:
        before_rows = rows_of(milvus, "nouns")
    before = snapshot(client)
    upload = problem(client.post(url, json={"ids": ["0"], "vectors": [[0.1] * 384]}), 409)
    assert "never writes" in upload["detail"] and "Milvus" in upload["detail"]
    problem(client.post(url, json={"ids": ["new"], "vectors": [[0.1] * 384]}), 409)
    problem(client.request("DELETE", url, json={"ids": ["0"]}), 409)
    assert snapshot(client) == before
    # Deleting the gallery detaches it: the collection stays, row for row.
    assert client.delete(f"/v1/galleries/{gallery['id']}").status_code == 204
    with owner(client) as milvus:
        assert rows_of(milvus, "nouns") == before_rows
        assert milvus.list_collections() == ["nouns"]


@pytest.mark.parametrize(
    ("source", "field", "words"),
    [
        ({"collection": "absent"}, "source.collection", "does not exist"),
        ({"id_field": "title"}, "source.id_field", "primary key"),
        ({"id_field": "nope"}, "source.id_field", "INT64 or VARCHAR"),
        ({"vector_field": "title"}, "source.vector_field", "FLOAT_VECTOR"),
        ({"metric": "L2"}, "source.metric", "need COSINE"),
        ({"uri": "/etc/passwd.db"}, "source.uri", "must lie under"),
        ({"uri": "../../outside.db"}, "source.uri", "must lie under"),
        ({"uri": "missing.db"}, "source.uri", "not a milvus-lite file"),
        ({"uri": "empty.db"}, "source.uri", "not a milvus-lite file"),
        ({"uri": "x" * 300 + ".db"}, "source.uri", "not a milvus-lite file"),
        ({"uri": "nul\u0000.db"}, "source.uri", "must lie under"),
        ({"uri": "http://127.0.0.1:2"}, "source.uri", "not an allowed Milvus server"),
        ({"uri": "http://127.0.0.1:1"}, "source.uri", "unreachable"),
        (
            {"uri": "http://127.0.0.1:1", "token_env": "NOBACKFILL_DATABASE_URL"},
            "source.token_env",
            "must be NOBACKFILL_MILVUS_TOKEN",
        ),
        ({"uri": "l2.db", "collection": "l2"}, "source.metric", "indexed for L2"),
        ({"collection": "nouns__nobackfill_mdl_1"}, "source.collection", "re-embedded"),
    ],
)
def test_attach_refusals_name_the_field_and_write_nothing(
    make_client, nouns: dict, tmp_path: Path, wordnet_small: dict, source: dict, field, words
) -> None:
    # The unreachable case names a server the settings allow; 127.0.0.1:2 is not allowed.
    client = make_client(milvus_allowed_urls=["http://127.0.0.1:1"])
    build_collection(
        milvus_root(tmp_path) / "l2.db", "l2", nouns["old"][:10], list(range(10)), metric="L2"
    )
    (milvus_root(tmp_path) / "empty.db").mkdir()
    before = snapshot(client)
    body = {"name": "g", "source": {**SOURCE, **source}}
    refused = problem(client.post("/v1/galleries", json=body), 422)
    assert refused["errors"][0]["field"] == field, refused
    assert words in refused["detail"], refused
    assert snapshot(client) == before
    assert not (tmp_path / "outside.db").exists()
    assert not (milvus_root(tmp_path) / "missing.db").exists()
    assert not any((milvus_root(tmp_path) / "empty.db").iterdir())


def test_a_milvus_lite_file_is_refused_with_celery_workers(tmp_path: Path, nouns: dict) -> None:
    """A Celery worker is another process: it could never open the file the API holds."""
    settings = Settings(_env_file=None, data_dir=tmp_path / "data", job_runner="celery")
    request = GalleryCreate(name="g", model_name="m", source=SOURCE)
    with pytest.raises(Problem) as refused:
        attach_gallery(None, settings, "tenant", request)  # type: ignore[arg-type]
    assert refused.value.status == 422 and "Celery" in refused.value.detail
    assert refused.value.errors[0].field == "source.uri"


def test_varchar_and_negative_keys_are_item_ids(
    client: TestClient, tmp_path: Path, wordnet_small: dict
) -> None:
    old = wordnet_small[OLD][:30]
    words = [f"synset-{i:02d}" for i in range(30)]
    build_collection(milvus_root(tmp_path) / "words.db", "words", old, words)
    keys = [-5 - i for i in range(28)] + [2**62 + 1, 2**63 - 1]
    build_collection(milvus_root(tmp_path) / "signed.db", "signed", old, keys)
    for name, ids in (("words", words), ("signed", [str(k) for k in keys])):
        source = {**SOURCE, "uri": f"{name}.db", "collection": name}
        gallery = attach(client, source, name=name)
        assert gallery["count"] == 30
        assert gallery["source"]["id_type"] == ("VARCHAR" if name == "words" else "INT64")
        found = top_ids(
            client.post(
                f"/v1/galleries/{gallery['id']}/search",
                json={"vectors": old[[0, 28, 29]].tolist(), "k": 2},
            )
        )
        assert [row[0] for row in found] == [ids[0], ids[28], ids[29]]
        read = client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": [ids[3]]})
        assert read.status_code == 200 and read.json()["ids"] == [ids[3]]
    # A non-canonical spelling of an INT64 key names no row.
    problem(client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ["-05"]}), 404)


@ON_BOTH
def test_attached_search_equals_the_copied_gallery_old_and_bridged(
    client: TestClient, nouns: dict, attach_source: dict
) -> None:
    """attach → dataset paired by primary keys → upgrade trained on the collection's vectors →
    search in the collection: the same top-10 as the same vectors uploaded as a gallery."""
    searches_like_the_copied_gallery(client, attach_source, nouns)


def test_milvus_unreachable_mid_search_is_a_503_and_writes_nothing(
    client: TestClient, nouns: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    gallery = attach(client, SOURCE)
    url = f"/v1/galleries/{gallery['id']}/search"
    assert top_ids(client.post(url, json={"vectors": nouns["old"][:1].tolist(), "k": 3}))
    before = snapshot(client)

    def lost(*args, **kwargs):
        raise MilvusUnavailableException(message="server unavailable")

    monkeypatch.setattr(MilvusClient, "search", lost)
    response = client.post(url, json={"vectors": nouns["old"][:2].tolist(), "k": 3})
    assert "unreachable" in problem(response, 503)["detail"]
    assert response.headers["Retry-After"]
    assert snapshot(client) == before
    monkeypatch.undo()
    assert top_ids(client.post(url, json={"vectors": nouns["old"][:1].tolist(), "k": 3}))
    # Out of reach when the process first opens the place (pymilvus connects at once).
    close_connections()
    monkeypatch.setattr(MilvusClient, "__init__", lost)
    response = client.post(url, json={"vectors": nouns["old"][:2].tolist(), "k": 3})
    assert "unreachable" in problem(response, 503)["detail"]
    assert response.headers["Retry-After"] and snapshot(client) == before
    monkeypatch.undo()
    assert top_ids(client.post(url, json={"vectors": nouns["old"][:1].tolist(), "k": 3}))


@ON_BOTH
def test_the_collection_changed_under_the_service(
    make_client, nouns: dict, wordnet_small: dict, attach_source: dict
) -> None:
    """The owner adds and deletes rows after attach: reads and searches see the collection as
    it is now (a row added later is named in answers; on a server whatever consistency level
    the owner's collection has), and the next start recounts it."""
    client = make_client()
    gallery = attach(client, attach_source)
    url = f"/v1/galleries/{gallery['id']}"
    extra = wordnet_small[OLD][N : N + 2]
    with owner(client, attach_source) as milvus:
        milvus.delete("nouns", filter="doc_id in [5, 6]")
        milvus.insert(
            "nouns",
            [
                {"doc_id": 10**12 + n, "title": "late", "embedding": v.tolist()}
                for n, v in enumerate(extra)
            ],
        )
    found = top_ids(
        client.post(
            f"{url}/search", json={"vectors": np.r_[extra, nouns["old"][[5]]].tolist(), "k": 3}
        )
    )
    assert [found[0][0], found[1][0]] == [str(10**12), str(10**12 + 1)]
    assert "5" not in found[2]
    problem(client.get(f"{url}/vectors", params={"ids": ["5"]}), 404)
    assert client.get(f"{url}/vectors", params={"ids": [str(10**12)]}).status_code == 200
    stop_client(client)
    close_connections()
    restarted = make_client()
    assert restarted.get(url).json()["count"] == N
    with owner(restarted, attach_source) as milvus:
        milvus.delete("nouns", filter="doc_id in [7]")
    stop_client(restarted)
    assert make_client().get(url).json()["count"] == N - 1


@pytest.mark.parametrize(
    "value",
    ["http://a:19530,https://b.example/milvus", '["http://a:19530", "https://b.example/milvus"]'],
)
def test_milvus_allowed_urls_read_from_a_comma_list_or_json(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("NOBACKFILL_MILVUS_ALLOWED_URLS", value)
    settings = Settings(_env_file=None)
    assert settings.milvus_allowed_urls == ["http://a:19530", "https://b.example/milvus"]
    from app.vectors.milvus.source import allowed_server

    allowed_server(settings, "https://b.example/milvus/db1")
    with pytest.raises(Problem):
        allowed_server(settings, "http://a:19530.evil")


def test_tied_rows_rank_by_id_like_the_copied_gallery(
    client: TestClient, tmp_path: Path, wordnet_small: dict
) -> None:
    """Duplicate documents tie exactly: ordered by id (a tie across the k-th place too), as the
    same vectors copied into a gallery in id order answer."""
    old = wordnet_small[OLD][:60].copy()
    tied = [41, 7, 33, 2, 19]
    old[tied] = old[0]
    order = tied + [i for i in range(60) if i not in tied]
    build_collection(milvus_root(tmp_path) / "dups.db", "dups", old[order], order)
    attached = attach(client, SOURCE | {"uri": "dups.db", "collection": "dups"})
    copied = copied_gallery(client, [str(i) for i in range(60)], old)
    for k in (2, 3, 5):
        answers = [
            top_ids(
                client.post(
                    f"/v1/galleries/{g['id']}/search",
                    json={"vectors": old[[0, 1]].tolist(), "k": k},
                )
            )
            for g in (attached, copied)
        ]
        assert answers[0] == answers[1], k
        assert answers[0][0] == [str(i) for i in sorted([0, *tied])][:k], k


def test_each_upgrade_rechecks_the_collection_and_reports_a_changed_count(
    client: TestClient, nouns: dict
) -> None:
    attached = attach(client, SOURCE)
    dataset_id = paired_dataset(client, attached["id"], nouns, range(10, 160))
    with owner(client) as milvus:
        milvus.delete("nouns", filter="doc_id in [0, 1, 2]")
    job = upgrade_on(client, dataset_id)
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["collection"] == {
        "points_recorded": N,
        "points_now": N - 3,
        "changed": True,
    }
    assert client.get(f"/v1/galleries/{attached['id']}").json()["count"] == N - 3
