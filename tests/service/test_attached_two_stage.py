"""Document texts and two-stage search on attached collections (issue 43, item 2): a Qdrant
local-mode collection or a milvus-lite collection attached with ``source.text_field`` (a payload
key, a VARCHAR field) holding each item's gloss text.

A two-stage search takes its candidates from the collection's own search, embeds those without a
new vector from their texts through the embedder stand-in (``bench.common.embedder_server``, the
fixture's recorded mpnet vectors) and writes them in place — the model's named vector in Qdrant,
its sibling collection in Milvus, and the service's counting rows — so the next search embeds
nothing. It answers the same top 10 as the same two-stage search of a copied gallery holding the
same vectors and texts. The re-embed job reads the texts from the collection and writes in place.
Items without a usable text are skipped and counted; a bad ``text_field`` answers 422, none 409.

Real vectors (tests/fixtures/wordnet_small.npz): item i is synset i's gloss. Both SQL backends
for the in-place two-stage search, SQLite for the rest (``sqlite_only``: no SQL path of their own);
FAISS only (attached galleries keep no vector in the service's engine). Milvus runs on milvus-lite
and, on SQLite, on the real Milvus 2.3.5 server (``milvus-server``; skipped where it cannot start,
failed instead with ``NOBACKFILL_TEST_MILVUS_SERVER=1``).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from pymilvus import DataType, MilvusClient
from pymilvus.exceptions import MilvusUnavailableException
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException

from tests.service.conftest import problem, snapshot
from tests.service.milvus_server import milvus_server_uri  # noqa: F401  (the fixture)
from tests.service.test_milvus_attach import (  # noqa: F401  (attach_source, make_settings: fixtures)
    attach_source,
    built_at,
    make_settings,
    owner,
)
from tests.service.test_qdrant_attach import qdrant_root
from tests.service.test_qdrant_migrate import attached_and_upgraded, collection
from tests.service.test_queries_api import NEW, OLD
from tests.service.test_two_stage_search import (  # noqa: F401  (embedder: the fixture)
    TEXTS,
    calls,
    control,
    embedder,
    reembedded_rows,
    top_ids,
)

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")

N = 400  # items in the collection
Q = np.arange(40)  # queries: the lemmas of the first 40 synsets
# Items whose text cannot be embedded: Qdrant: no key, an empty string, a number; Milvus: empty.
BAD = {"qdrant": {5: None, 6: "", 7: 123}, "milvus": {5: "", 6: ""}}
QDRANT_SOURCE = {"engine": "qdrant", "path": "glosses", "collection": "glosses"}


def text_of(engine: str, i: int):
    return BAD[engine].get(i, TEXTS[i]["gloss"])


def build_qdrant(folder: Path, old: np.ndarray) -> None:
    """A local-mode collection of ``old`` whose points carry their gloss under ``gloss``."""
    client = QdrantClient(path=str(folder))
    params = models.VectorParams(size=old.shape[1], distance=models.Distance.COSINE)
    client.create_collection("glosses", vectors_config=params)
    points = []
    for i, v in enumerate(old):
        text = text_of("qdrant", i)
        payload = {"title": f"row {i}"} | ({} if i == 5 else {"gloss": text})
        points.append(models.PointStruct(id=i, vector=v.tolist(), payload=payload))
    client.upsert("glosses", points=points)
    client.close()


def build_milvus(where: Path | str, old: np.ndarray) -> None:
    """A collection ``nouns`` of ``old`` with a VARCHAR field ``gloss`` (FLAT, COSINE)."""
    if isinstance(where, Path):
        where.parent.mkdir(parents=True, exist_ok=True)
        client = MilvusClient(str(where))
    else:
        client = MilvusClient(uri=where)
    schema = client.create_schema(auto_id=False)
    schema.add_field("doc_id", DataType.INT64, is_primary=True)
    schema.add_field("gloss", DataType.VARCHAR, max_length=1024)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=old.shape[1])
    index = client.prepare_index_params()
    index.add_index("embedding", index_type="FLAT", metric_type="COSINE")
    client.create_collection("nouns", schema=schema, index_params=index)
    rows = [
        {"doc_id": i, "gloss": text_of("milvus", i), "embedding": v.tolist()}
        for i, v in enumerate(old)
    ]
    client.insert("nouns", rows)
    client.close()


@pytest.fixture(params=["qdrant", "milvus", "milvus-server"])
def engine_place(request: pytest.FixtureRequest) -> str:
    """Where the collection lives: a Qdrant local-mode folder, a milvus-lite file, or the
    shared Milvus server (``tests/service/milvus_server.py``; skipped where it cannot start)."""
    return str(request.param)


@pytest.fixture
def engine(engine_place: str) -> str:
    return engine_place.split("-")[0]


@pytest.fixture
def place(engine_place: str) -> str:
    """``test_milvus_attach``'s ``attach_source`` reads it: the server for ``milvus-server``."""
    return "server" if engine_place.endswith("server") else "lite"


@pytest.fixture
def source(engine: str, tmp_path: Path, wordnet_small: dict, request) -> dict:
    """The collection built where it is attached from; the source to attach it with."""
    old = wordnet_small[f"gloss.{OLD}"][:N]
    if engine == "qdrant":
        build_qdrant(qdrant_root(tmp_path) / "glosses", old)
        return dict(QDRANT_SOURCE)
    milvus = request.getfixturevalue("attach_source")
    build_milvus(built_at(tmp_path, milvus, "nouns.db"), old)
    return dict(milvus)


@pytest.fixture
def client(make_client, embedder: str) -> TestClient:  # noqa: F811
    return make_client(embedder_allowed_urls=[embedder], embedder_max_batch=1024)


@pytest.fixture
def migration(
    client: TestClient,
    source: dict,
    engine: str,
    embedder: str,  # noqa: F811
    wordnet_small: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> dict:
    """Attached with ``text_field``, a copied gallery of the same vectors and texts, a backbone
    model upgraded on the attached gallery, and the embedder set on the model."""
    old = wordnet_small[f"gloss.{OLD}"][:N]
    state = attached_and_upgraded(
        client, source | {"text_field": "gloss"}, old, wordnet_small, monkeypatch
    )
    texts = [text_of(engine, i) for i in range(N)]
    texts = [t if isinstance(t, str) and t else None for t in texts]
    upload = client.post(
        f"/v1/galleries/{state['copied']}/vectors",
        json={"ids": state["ids"], "vectors": old.tolist(), "texts": texts},
    )
    assert upload.status_code == 200, upload.text
    created = client.post(
        "/v1/embedders",
        json={
            "name": "mpnet",
            "url": embedder,
            "model": "all-mpnet-base-v2",
            "dimension": 768,
            "max_batch": 1024,
        },
    )
    assert created.status_code == 201, created.text
    patched = client.patch(
        f"/v1/models/{state['model_id']}", json={"embedder_id": created.json()["id"]}
    )
    assert patched.status_code == 200, patched.text
    control(embedder, "ok")
    return state | {"client": client, "embedder": embedder, "engine": engine, "source": source}


def search(migration: dict, wordnet_small: dict, gallery: str = "attached", **extra):
    body = {
        "model_id": migration["model_id"],
        "features": wordnet_small[f"lemma.{NEW}"][Q].tolist(),
        "old_vectors": wordnet_small[f"lemma.{OLD}"][Q].tolist(),
        "k": 10,
        "rerank": {"depth": 20},
        **extra,
    }
    body = {k: v for k, v in body.items() if v is not None}
    return migration["client"].post(f"/v1/galleries/{migration[gallery]}/search", json=body)


def in_place_keys(migration: dict) -> set[str]:
    """Item ids of the items the collection holds a vector of the model for."""
    client, model_id = migration["client"], migration["model_id"]
    if migration["engine"] == "qdrant":
        name = f"nobackfill_{model_id}"
        with collection(client) as qdrant:
            records, _ = qdrant.scroll("glosses", limit=10_000, with_vectors=[name])
        return {str(r.id) for r in records if isinstance(r.vector, dict) and name in r.vector}
    with owner(client, migration["source"]) as milvus:
        name = f"nouns__nobackfill_{model_id}"
        if not milvus.has_collection(name):
            return set()
        rows = milvus.query(
            name, filter="", output_fields=["id"], limit=9999, consistency_level="Strong"
        )
        return {str(r["id"]) for r in rows}


@pytest.mark.sqlite_only("an attach's own checks; PostgreSQL: the in-place search test")
def test_attach_shows_the_text_field(client: TestClient, source: dict) -> None:
    created = client.post(
        "/v1/galleries",
        json={"name": "g", "model_name": "m", "source": source | {"text_field": "gloss"}},
    )
    assert created.status_code == 201, created.text
    shown = client.get(f"/v1/galleries/{created.json()['id']}").json()
    assert shown["source"]["text_field"] == "gloss"


@pytest.mark.sqlite_only("an attach's own checks; PostgreSQL: the in-place search test")
@pytest.mark.parametrize("field", ["nope", "embedding_or_key"])
def test_a_bad_text_field_is_refused_and_changes_nothing(
    client: TestClient, source: dict, engine: str, field: str
) -> None:
    if field == "embedding_or_key":
        # Milvus: a field that exists but holds no text; Qdrant: a key no point carries.
        field = "embedding" if engine == "milvus" else "nobackfill_models"
    before = snapshot(client)
    body = {"name": "g", "model_name": "m", "source": source | {"text_field": field}}
    refused = problem(client.post("/v1/galleries", json=body), 422)
    assert refused["errors"][0]["field"] == "source.text_field", refused
    assert repr(field) in refused["detail"]
    assert snapshot(client) == before


@pytest.mark.sqlite_only("an attach's own checks; PostgreSQL: the in-place search test")
def test_without_a_text_field_two_stage_and_reembed_answer_409_with_the_hint(
    client: TestClient, source: dict
) -> None:
    created = client.post("/v1/galleries", json={"name": "g", "model_name": "m", "source": source})
    assert created.status_code == 201, created.text
    gallery = created.json()
    body = {"model_id": "mdl_x", "features": [[0.1] * 768], "k": 3, "rerank": {}}
    before = snapshot(client)
    refused = problem(client.post(f"/v1/galleries/{gallery['id']}/search", json=body), 409)
    assert "source.text_field" in refused["detail"]
    job = client.post(f"/v1/galleries/{gallery['id']}/reembed", json={"model_id": "mdl_x"})
    assert "source.text_field" in problem(job, 409)["detail"]
    assert snapshot(client) == before


def test_two_stage_search_embeds_candidates_in_place_once(
    migration: dict, wordnet_small: dict
) -> None:
    client, url = migration["client"], migration["embedder"]
    assert in_place_keys(migration) == set()
    first = search(migration, wordnet_small)
    info = first.json()["rerank"]
    assert first.status_code == 200 and "degraded" not in info, first.text
    assert info["embedded"] > 20 and calls(url) == 1
    bad = {str(i) for i in BAD[migration["engine"]]}
    written = in_place_keys(migration)
    # Embedded and written in place: the candidates with a usable text (the others skipped).
    assert len(written) == info["embedded"] == info["scored_new"] == reembedded_rows(client)
    assert not written & bad
    # Stored in place: the same search embeds nothing more and answers the same.
    again = search(migration, wordnet_small)
    assert again.json()["rerank"]["embedded"] == 0 and calls(url) == 1
    assert top_ids(again) == top_ids(first)
    assert in_place_keys(migration) == written
    # The same answer as the copied gallery holding the same vectors and texts.
    copied = search(migration, wordnet_small, gallery="copied")
    assert copied.json()["rerank"]["embedded"] == info["embedded"]
    assert top_ids(first) == top_ids(copied)
    # Progress counts them as any in-place migration's items.
    shown = client.get(f"/v1/galleries/{migration['attached']}").json()["reembedded"]
    assert shown[0]["reembedded"] == len(written)


def reembed_job(migration: dict, **body) -> dict:
    client = migration["client"]
    created = client.post(
        f"/v1/galleries/{migration['attached']}/reembed",
        json={"model_id": migration["model_id"], **body},
    )
    assert created.status_code == 202, created.text
    job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    return job["report"]["reembed"]


@pytest.mark.sqlite_only("an attach's own checks; PostgreSQL: the in-place search test")
def test_the_reembed_job_reads_texts_from_the_collection(
    migration: dict, wordnet_small: dict
) -> None:
    client = migration["client"]
    # The plan's order, a quarter of the gallery.
    first = reembed_job(migration, fraction=0.25)
    assert first["order"] == "plan", first
    assert first["embedded"] + first["skipped"] == first["targeted"] > 0, first
    assert first["reembedded"] == first["embedded"] == len(in_place_keys(migration))
    # Then the rest in the gallery's order: every item with a usable text, the others skipped
    # (again: an item skipped once is tried by every later job, its text may have come).
    rest = reembed_job(migration, order="gallery")
    bad = len(BAD[migration["engine"]])
    assert rest["targeted"] == N - first["reembedded"] and rest["skipped"] == bad, rest
    assert rest["reembedded"] == N - bad and rest["total"] == N
    written = in_place_keys(migration)
    assert len(written) == N - bad == reembedded_rows(client)
    assert not written & {str(i) for i in BAD[migration["engine"]]}
    # Everything with a text is embedded: a two-stage search embeds nothing.
    calls_before = calls(migration["embedder"])
    found = search(migration, wordnet_small)
    assert found.json()["rerank"]["embedded"] == 0
    assert calls(migration["embedder"]) == calls_before


@pytest.mark.sqlite_only("an attach's own checks; PostgreSQL: the in-place search test")
@pytest.mark.parametrize(
    "engine_place", ["qdrant", "milvus"], indirect=True
)  # the server: the other tests
def test_a_failing_embedder_degrades_and_stores_nothing(
    migration: dict, wordnet_small: dict
) -> None:
    client = migration["client"]
    single = top_ids(search(migration, wordnet_small, rerank=None))
    control(migration["embedder"], "error")
    before = snapshot(client)
    degraded = search(migration, wordnet_small)
    assert degraded.status_code == 200, degraded.text
    assert degraded.json()["rerank"]["degraded"] == "embedder-http-error"
    assert top_ids(degraded) == single
    assert snapshot(client) == before and reembedded_rows(client) == 0
    assert in_place_keys(migration) == set()


@pytest.mark.sqlite_only("an attach's own checks; PostgreSQL: the in-place search test")
@pytest.mark.parametrize(
    "engine_place", ["qdrant", "milvus"], indirect=True
)  # the server: the other tests
def test_the_collection_unreachable_mid_two_stage_is_a_503_and_writes_nothing(
    migration: dict, wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = migration["client"]
    before = snapshot(client)
    if migration["engine"] == "qdrant":

        def lost(*args, **kwargs):
            raise ResponseHandlingException(httpx.ConnectError("connection refused"))

        # Stage one answers; reading the candidates' texts finds the collection gone.
        monkeypatch.setattr(QdrantClient, "retrieve", lost)
    else:

        def lost(*args, **kwargs):
            raise MilvusUnavailableException(message="server unavailable")

        monkeypatch.setattr(MilvusClient, "query", lost)
    response = search(migration, wordnet_small)
    assert "unreachable" in problem(response, 503)["detail"]
    assert response.headers["Retry-After"]
    monkeypatch.undo()
    assert snapshot(client) == before and reembedded_rows(client) == 0
    assert calls(migration["embedder"]) == 0 and in_place_keys(migration) == set()
