"""Attached data belongs to one tenant (issue 45, item 1).

The probe that found the hole: tenant A attached an embedded Qdrant folder, tenant B attached the
same ``path``, got 201 and read A's points. Now each tenant's embedded stores (Qdrant local-mode
folders, milvus-lite files) resolve under its own folder of the attach root
(``source_rules.tenant_folder``), so no spelling of a path reaches another tenant's store; and a
collection on a server is recorded with the tenant that attached it, another tenant's attach of
it answering 403 before the server is contacted, unless the operator lists the server in
``attach_shared_urls``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.galleries.models import AttachedOwner
from app.vectors.source_rules import owner_key, place_of
from bench.perf.api_memory import milvus_server
from tests.service.conftest import problem, snapshot
from tests.service.test_galleries_api import other_tenant
from tests.service.test_milvus_attach import build_collection as build_milvus
from tests.service.test_milvus_attach import milvus_root
from tests.service.test_qdrant_attach import OLD, build_collection, qdrant_root

pytestmark = pytest.mark.faiss_only("attached galleries keep no vector in the service's engine")

N = 40


def attached(
    client: TestClient, source: dict, headers: dict | None = None, name: str = "g"
) -> dict:
    response = client.post(
        "/v1/galleries", json={"name": name, "model_name": "m", "source": source}, headers=headers
    )
    assert response.status_code == 201, response.text
    return response.json()


def rivals_attach(client: TestClient, rival: dict, source: dict, status: int) -> dict:
    """The rival tenant's attach of ``source``, refused with ``status``: its problem body."""
    response = client.post(
        "/v1/galleries",
        json={"name": "stolen", "model_name": "m", "source": source},
        headers=rival,
    )
    return problem(response, status)


def test_another_tenant_cannot_attach_a_tenants_qdrant_folder(
    client: TestClient, tmp_path: Path, wordnet_small: dict
) -> None:
    owner_folder = qdrant_root(tmp_path) / "products"
    build_collection(owner_folder, "products", wordnet_small[OLD][:N], list(range(N)))
    source = {"engine": "qdrant", "path": "products", "collection": "products"}
    assert attached(client, source)["count"] == N
    rival = other_tenant(client)
    before = snapshot(client)
    for path in (
        "products",  # the same path: the rival's own folder has no such store
        "local/products",
        "../local/products",
        "../local/products/.",
        "./../local/products",
        str(owner_folder),  # absolute
        str(owner_folder.parent.parent / "local" / "products"),
    ):
        refused = rivals_attach(client, rival, {**source, "path": path}, 422)
        assert refused["errors"][0]["field"] == "source.path", (path, refused)
    assert snapshot(client) == before
    # The rival's own folder works as before.
    build_collection(
        qdrant_root(tmp_path, "rival") / "products",
        "products",
        wordnet_small[OLD][:5],
        [0, 1, 2, 3, 4],
    )
    assert attached(client, source, rival)["count"] == 5


def test_another_tenant_cannot_attach_a_tenants_milvus_lite_file(
    client: TestClient, tmp_path: Path, wordnet_small: dict
) -> None:
    build_milvus(
        milvus_root(tmp_path) / "nouns.db", "nouns", wordnet_small[OLD][:N], list(range(N))
    )
    source = {
        "engine": "milvus",
        "uri": "nouns.db",
        "collection": "nouns",
        "id_field": "doc_id",
        "vector_field": "embedding",
    }
    assert attached(client, source)["count"] == N
    rival = other_tenant(client)
    before = snapshot(client)
    for uri in ("nouns.db", "../local/nouns.db", str(milvus_root(tmp_path) / "nouns.db")):
        refused = rivals_attach(client, rival, {**source, "uri": uri}, 422)
        assert refused["errors"][0]["field"] == "source.uri", (uri, refused)
    assert snapshot(client) == before


def test_a_source_recorded_without_a_tenant_folder_is_refused_on_open(
    client: TestClient, tmp_path: Path, wordnet_small: dict
) -> None:
    """A gallery attached before tenants had folders (its source has no ``folder``) may name
    another tenant's store: it is not opened any more; the message says how to attach again."""
    build_collection(qdrant_root(tmp_path) / "old", "old", wordnet_small[OLD][:N], list(range(N)))
    gallery = attached(client, {"engine": "qdrant", "path": "old", "collection": "old"})
    state = client.app.state.service
    from app.galleries.models import Gallery

    with state.db.sessions() as session:
        row = session.get(Gallery, gallery["id"])
        assert row is not None
        row.source = {k: v for k, v in row.source.items() if k != "folder"}
        session.commit()
    # A fresh process: no client of the folder is open yet.
    from app.vectors.qdrant.source import close_connections

    close_connections()
    query = wordnet_small[OLD][:1].tolist()
    refused = problem(
        client.post(f"/v1/galleries/{gallery['id']}/search", json={"vectors": query, "k": 3}), 422
    )
    assert "attach it again" in refused["detail"]


@pytest.fixture
def milvus_server_uri(tmp_path: Path) -> Iterator[str]:
    """A Milvus server (milvus-lite's gRPC server process) on a free port."""
    with milvus_server(tmp_path / "milvus-server") as (uri, _process):
        yield uri


def test_a_collection_on_a_server_belongs_to_the_tenant_that_attached_it(
    make_client, tmp_path: Path, wordnet_small: dict, milvus_server_uri: str
) -> None:
    from pymilvus import MilvusClient

    seed = tmp_path / "seed.db"
    build_milvus(seed, "nouns", wordnet_small[OLD][:N], list(range(N)))
    # The same rows, written into the server the tenants attach.
    rows = MilvusClient(str(seed)).query(
        "nouns", filter="", output_fields=["doc_id", "title", "embedding"], limit=N
    )
    server = MilvusClient(uri=milvus_server_uri)
    schema = MilvusClient.create_schema(auto_id=False)
    from pymilvus import DataType

    schema.add_field("doc_id", DataType.INT64, is_primary=True)
    schema.add_field("title", DataType.VARCHAR, max_length=64)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=wordnet_small[OLD].shape[1])
    index = server.prepare_index_params()
    index.add_index("embedding", index_type="FLAT", metric_type="COSINE")
    server.create_collection("nouns", schema=schema, index_params=index)
    server.insert("nouns", rows)
    server.close()

    client = make_client(milvus_allowed_urls=[milvus_server_uri])
    source = {
        "engine": "milvus",
        "uri": milvus_server_uri,
        "collection": "nouns",
        "id_field": "doc_id",
        "vector_field": "embedding",
    }
    mine = attached(client, source)
    assert mine["count"] == N
    # Its owner is recorded under the normalised place.
    with client.app.state.service.db.sessions() as session:
        owners = session.scalars(select(AttachedOwner)).all()
    place = place_of(milvus_server_uri)
    assert place is not None
    assert [(o.key, o.place, o.collection) for o in owners] == [
        (owner_key("milvus", place, "nouns"), place, "nouns")
    ]
    # The owner may attach it again (a second gallery on it, spelt otherwise).
    second = attached(client, {**source, "uri": milvus_server_uri + "/"}, name="g2")
    rival = other_tenant(client)
    before = snapshot(client)
    for uri in (
        milvus_server_uri,
        milvus_server_uri + "/",
        milvus_server_uri + "/x/..",
        milvus_server_uri + "/%2e",
        milvus_server_uri.upper().replace("HTTP://", "http://"),
    ):
        refused = rivals_attach(client, rival, {**source, "uri": uri}, 403)
        assert "another tenant" in refused["detail"], (uri, refused)
    assert snapshot(client) == before
    # The owner lets go (deletes both its galleries): the collection is free for the next
    # tenant; after the first delete it is still the owner's.
    assert client.delete(f"/v1/galleries/{mine['id']}").status_code == 204
    rivals_attach(client, rival, source, 403)
    assert client.delete(f"/v1/galleries/{second['id']}").status_code == 204
    taken = attached(client, source, rival)
    assert taken["count"] == N
    refused = problem(
        client.post("/v1/galleries", json={"name": "back", "model_name": "m", "source": source}),
        403,
    )
    assert "NOBACKFILL_ATTACH_SHARED_URLS" in refused["detail"]


def test_a_shared_server_lets_every_tenant_attach_its_collections(
    make_client, tmp_path: Path, wordnet_small: dict
) -> None:
    """A server the operator lists as shared records no owner: the claim check passes for every
    tenant (here the server is unreachable, so each attach reaches the connection and fails
    there, 422 on ``source.uri``, instead of the 403)."""
    url = "http://127.0.0.1:1"
    client = make_client(milvus_allowed_urls=[url], attach_shared_urls=[url])
    source = {
        "engine": "milvus",
        "uri": url,
        "collection": "nouns",
        "id_field": "doc_id",
        "vector_field": "embedding",
    }
    with client.app.state.service.db.sessions() as session:
        from app.auth.service import get_or_create_tenant

        rival_id = get_or_create_tenant(session, "owner-elsewhere").id
        place = place_of(url)
        assert place is not None
        session.add(
            AttachedOwner(
                key=owner_key("milvus", place, "nouns"),
                engine="milvus",
                place=place,
                collection="nouns",
                tenant_id=rival_id,
            )
        )
        session.commit()
    shared = problem(
        client.post("/v1/galleries", json={"name": "g", "model_name": "m", "source": source}), 422
    )
    assert shared["errors"][0]["field"] == "source.uri"
    assert "unreachable" in shared["detail"]
