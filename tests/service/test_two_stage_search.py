"""Two-stage search through the API (issue 43, items 1–4 and 7), against a real embedder server
process (``bench.common.embedder_server``: the OpenAI-compatible embeddings protocol, answering
the fixture's real mpnet vectors of its lemma and gloss texts).

The gallery holds 400 glosses by MiniLM with their texts; a procrustes model is trained for it
(``test_backfill_api.upgraded``) and given the embedder. A search with ``rerank`` takes each
query's candidates from the old index, embeds those without a new vector in one batched call,
stores them as re-embedded items of the model, and ranks them by the new model — the same top 10
as a numpy two-stage on the same vectors. Faults of the embedder answer the single-stage search
(200, ``degraded``, a header) and store nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.vectors.tables import ReembeddedVector
from bench.common.embedder_server import running
from tests.service.conftest import problem, snapshot
from tests.service.test_backfill_api import N_GALLERY, upgraded
from tests.service.test_galleries_api import other_tenant
from tests.service.test_queries_api import NEW, OLD

REPO = Path(__file__).resolve().parents[2]
TEXTS = json.loads((REPO / "tests/fixtures/wordnet_small_texts.json").read_text())
Q = np.arange(40)  # queries: the lemmas of the first 40 synsets (relevant: their own gloss)


@pytest.fixture
def embedder(tmp_path: Path) -> Iterator[str]:
    """The embedder server process; its embeddings URL."""
    with running(tmp_path / "embedder.log") as url:
        yield url


def control(url: str, mode: str) -> None:
    base = url.rsplit("/v1/", 1)[0]
    assert httpx.post(f"{base}/control", json={"mode": mode}).status_code == 200


def calls(url: str) -> int:
    return httpx.get(url.rsplit("/v1/", 1)[0] + "/stats").json()["calls"]


def with_texts(client: TestClient, wordnet_small: dict, gallery_id: str) -> None:
    """The gallery's items again, now with their gloss texts."""
    upload = client.post(
        f"/v1/galleries/{gallery_id}/vectors",
        json={
            "ids": [str(i) for i in wordnet_small["synset_id"][:N_GALLERY]],
            "vectors": wordnet_small[f"gloss.{OLD}"][:N_GALLERY].tolist(),
            "texts": [row["gloss"] for row in TEXTS[:N_GALLERY]],
        },
    )
    assert upload.status_code == 200, upload.text


@pytest.fixture
def setup(make_client, wordnet_small: dict, embedder: str, request) -> dict:
    overrides = getattr(request, "param", {})
    client = make_client(
        embedder_allowed_urls=[embedder],
        embedder_max_batch=1024,
        embedder_circuit_failures=overrides.get("failures", 100),
        embedder_timeout_s=overrides.get("timeout", 5.0),
        embed_items_per_minute=overrides.get("budget", 20_000),
        **(
            {"db_pool_size": 1, "db_pool_overflow": 0, "db_pool_timeout_s": 1.0}
            if overrides.get("pool")
            else {}
        ),
    )
    state = upgraded(client, wordnet_small)
    with_texts(client, wordnet_small, state["gallery_id"])
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
    assert patched.json()["embedder_id"] == created.json()["id"]
    control(embedder, "ok")
    return state | {"client": client, "embedder": embedder, "embedder_id": created.json()["id"]}


def search(setup: dict, wordnet_small: dict, **extra):
    body = {
        "model_id": setup["model_id"],
        "features": wordnet_small[f"lemma.{NEW}"][Q].tolist(),
        "old_vectors": wordnet_small[f"lemma.{OLD}"][Q].tolist(),
        "k": 10,
        "rerank": {"depth": 20},
        **extra,
    }
    body = {k: v for k, v in body.items() if v is not None}
    return setup["client"].post(f"/v1/galleries/{setup['gallery_id']}/search", json=body)


def numpy_two_stage(wordnet_small: dict, depth: int = 20) -> list[list[str]]:
    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    ids = np.asarray([str(i) for i in wordnet_small["synset_id"][:N_GALLERY]])
    old = unit(wordnet_small[f"lemma.{OLD}"][Q]) @ unit(wordnet_small[f"gloss.{OLD}"][:N_GALLERY]).T
    new = unit(wordnet_small[f"lemma.{NEW}"][Q]) @ unit(wordnet_small[f"gloss.{NEW}"][:N_GALLERY]).T
    out = []
    for q in range(len(Q)):
        cands = sorted(range(N_GALLERY), key=lambda j: (-old[q, j], j))[:depth]
        out.append([ids[j] for j in sorted(cands, key=lambda j: -new[q, j])[:10]])
    return out


def reembedded_rows(client: TestClient) -> int:
    with client.app.state.service.db.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(ReembeddedVector)) or 0)


def top_ids(response) -> list[list[str]]:
    assert response.status_code == 200, response.text
    return [[hit["id"] for hit in row] for row in response.json()["results"]]


def test_candidates_are_embedded_once_and_ranked_by_the_new_model(
    setup: dict, wordnet_small: dict
) -> None:
    client, url = setup["client"], setup["embedder"]
    first = search(setup, wordnet_small)
    info = first.json()["rerank"]
    assert info["depth"] == 20 and info["candidates"] > 20
    assert info["embedded"] == info["candidates"] == info["scored_new"]
    assert "degraded" not in info and "X-Nobackfill-Degraded" not in first.headers
    assert all(hit["space"] == "new" for row in first.json()["results"] for hit in row)
    assert top_ids(first) == numpy_two_stage(wordnet_small)
    assert calls(url) == 1  # one batched call for every candidate of the request
    assert reembedded_rows(client) == info["embedded"]
    # Stored: the same search embeds nothing more and answers the same.
    again = search(setup, wordnet_small)
    assert again.json()["rerank"]["embedded"] == 0 and calls(url) == 1
    assert top_ids(again) == top_ids(first)
    # A deeper search embeds only the new candidates.
    deeper = search(setup, wordnet_small, rerank={"depth": 40})
    assert 0 < deeper.json()["rerank"]["embedded"] < deeper.json()["rerank"]["candidates"]
    assert top_ids(deeper) == numpy_two_stage(wordnet_small, depth=40)


def test_query_texts_go_through_the_embedder(setup: dict, wordnet_small: dict) -> None:
    by_features = top_ids(search(setup, wordnet_small))
    texts = [TEXTS[q]["lemma"] for q in Q]
    by_texts = search(setup, wordnet_small, features=None, texts=texts)
    assert top_ids(by_texts) == by_features
    # Bridged candidates (no old_vectors): the bridged query's neighbours, reranked.
    bridged = search(setup, wordnet_small, old_vectors=None)
    assert bridged.status_code == 200 and bridged.json()["rerank"]["scored_new"] > 0


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("error", "embedder-http-error"),
        ("nan", "embedder-not-finite"),
        ("wrong_dim", "embedder-wrong-dimension"),
        ("wrong_count", "embedder-wrong-count"),
    ],
)
def test_a_failing_embedder_degrades_and_stores_nothing(
    setup: dict, wordnet_small: dict, mode: str, reason: str
) -> None:
    client = setup["client"]
    single = top_ids(search(setup, wordnet_small, rerank=None))  # the transition search
    control(setup["embedder"], mode)
    before = snapshot(client)
    degraded = search(setup, wordnet_small)
    assert degraded.status_code == 200, degraded.text
    assert degraded.json()["rerank"]["degraded"] == reason
    assert degraded.headers["X-Nobackfill-Degraded"] == reason
    assert top_ids(degraded) == single
    assert snapshot(client) == before and reembedded_rows(client) == 0


@pytest.mark.parametrize("setup", [{"timeout": 1.0}], indirect=True)
def test_a_hung_or_dead_embedder_degrades(setup: dict, wordnet_small: dict) -> None:
    control(setup["embedder"], "hang")
    hung = search(setup, wordnet_small)
    assert hung.json()["rerank"]["degraded"] == "embedder-timeout"
    # Texts only, the embedder hung and no old vectors: nothing to answer with.
    texts = [TEXTS[q]["lemma"] for q in Q]
    refused = search(setup, wordnet_small, features=None, old_vectors=None, texts=texts)
    assert "embedder is unavailable" in problem(refused, 503)["detail"]
    assert int(refused.headers["Retry-After"]) >= 1
    # With old vectors the texts-only search answers the old model's own search.
    stay = search(setup, wordnet_small, features=None, texts=texts)
    assert stay.json()["rerank"]["degraded"] == "embedder-timeout"
    assert all(hit["space"] == "old" for row in stay.json()["results"] for hit in row)
    assert reembedded_rows(setup["client"]) == 0


@pytest.mark.parametrize("setup", [{"failures": 2}], indirect=True)
def test_repeated_failures_open_the_circuit(setup: dict, wordnet_small: dict) -> None:
    control(setup["embedder"], "error")
    reasons = [search(setup, wordnet_small).json()["rerank"]["degraded"] for _ in range(3)]
    assert reasons == ["embedder-http-error", "embedder-http-error", "embedder-circuit-open"]
    assert calls(setup["embedder"]) == 2  # the open circuit made no call


@pytest.mark.parametrize("setup", [{"budget": 30}], indirect=True)
def test_the_embedding_budget_answers_429(setup: dict, wordnet_small: dict) -> None:
    client = setup["client"]
    before = snapshot(client)
    spent = search(setup, wordnet_small)
    body = problem(spent, 429)
    assert "EMBED_ITEMS_PER_MINUTE" in body["detail"] and int(spent.headers["Retry-After"]) >= 1
    assert snapshot(client) == before and calls(setup["embedder"]) == 0


def test_bad_two_stage_requests_are_refused_whole(setup: dict, wordnet_small: dict) -> None:
    client = setup["client"]
    before = snapshot(client)
    cases = [
        ({"rerank": {"depth": 5000}}, 422, "rerank.depth"),
        ({"rerank": {"depth": 5}}, 422, "rerank.depth"),
        ({"rerank": {"depth": 0}}, 422, "rerank"),
        ({"rerank": {"deep": 3}}, 422, "rerank"),
        ({"model_id": None}, 422, "rerank"),
        ({"texts": ["a"], "features": None, "rerank": None}, 422, "texts"),
        ({"old_vectors": wordnet_small[f"lemma.{OLD}"][:3].tolist()}, 422, "old_vectors"),
    ]
    for extra, status, field in cases:
        refused = problem(search(setup, wordnet_small, **extra), status)
        fields = [e["field"] for e in refused.get("errors", [])]
        assert field in fields or field in refused["detail"], (extra, refused)
    assert snapshot(client) == before and calls(setup["embedder"]) == 0


def test_texts_are_stored_replaced_and_deleted_with_their_items(
    setup: dict, wordnet_small: dict
) -> None:
    client, gallery_id = setup["client"], setup["gallery_id"]
    first = str(wordnet_small["synset_id"][0])

    def text_of(item: str) -> str | None:
        from app.galleries.models import Gallery
        from app.galleries.service import item_texts
        from app.vectors.storage import storage_for

        with client.app.state.service.db.sessions() as session:
            gallery = session.get(Gallery, gallery_id)
            found = storage_for(session, gallery).lookup(session, gallery, [item])
            if item not in found:
                return None
            vector_id = found[item][0]
            return item_texts(session, gallery_id, [vector_id]).get(vector_id)

    assert text_of(first) == TEXTS[0]["gloss"]
    vector = wordnet_small[f"gloss.{OLD}"][:1].tolist()
    replaced = client.post(
        f"/v1/galleries/{gallery_id}/vectors", json={"ids": [first], "vectors": vector}
    )
    assert replaced.status_code == 200
    assert text_of(first) is None  # an upsert without a text leaves none
    client.post(
        f"/v1/galleries/{gallery_id}/vectors",
        json={"ids": [first], "vectors": vector, "texts": ["new text"]},
    )
    assert text_of(first) == "new text"
    assert (
        client.request(
            "DELETE", f"/v1/galleries/{gallery_id}/vectors", json={"ids": [first]}
        ).status_code
        == 200
    )
    assert text_of(first) is None
    before = snapshot(client)
    for texts, field in (([], "texts"), (["x" * 9000], "texts[0]"), ([3], "texts[0]")):
        refused = problem(
            client.post(
                f"/v1/galleries/{gallery_id}/vectors",
                json={"ids": ["a"], "vectors": vector, "texts": texts},
            ),
            422,
        )
        assert field in [e["field"] for e in refused.get("errors", [])] + [refused["detail"]], (
            refused
        )
    assert snapshot(client) == before


def test_embedders_belong_to_their_tenant_and_are_checked(setup: dict) -> None:
    client, url = setup["client"], setup["embedder"]
    rival = other_tenant(client)
    assert client.get(f"/v1/embedders/{setup['embedder_id']}", headers=rival).status_code == 404
    listed = client.get("/v1/embedders").json()["items"]
    assert [e["id"] for e in listed] == [setup["embedder_id"]]
    assert "key" not in json.dumps(listed).lower().replace("api_key_env", "")
    before = snapshot(client)
    body = {"name": "x", "url": url, "model": "m", "dimension": 768}
    for extra, field in (
        ({"url": "http://169.254.169.254/v1/embeddings"}, "url"),
        ({"url": url.replace("/v1/embeddings", "/v1/../admin")}, "url"),
        ({"api_key_env": "NOBACKFILL_DATABASE_URL"}, "api_key_env"),
        ({"max_batch": 100_000}, "max_batch"),
        ({"name": "mpnet"}, "name"),
    ):
        refused = client.post("/v1/embedders", json={**body, **extra})
        assert refused.status_code in (409, 422), (extra, refused.text)
        if refused.status_code == 422:
            assert field in [e["field"] for e in refused.json()["errors"]], refused.text
    # A model whose input dimension differs; an embedder in use cannot go.
    small = client.post("/v1/embedders", json={**body, "name": "small", "dimension": 384})
    assert small.status_code == 201
    wrong = client.patch(
        f"/v1/models/{setup['model_id']}", json={"embedder_id": small.json()["id"]}
    )
    assert problem(wrong, 422)["errors"][0]["field"] == "embedder_id"
    assert client.delete(f"/v1/embedders/{setup['embedder_id']}").status_code == 409
    assert client.delete(f"/v1/embedders/{small.json()['id']}").status_code == 204
    assert snapshot(client)["embedders"] == before["embedders"]
    cleared = client.patch(f"/v1/models/{setup['model_id']}", json={"embedder_id": None})
    assert cleared.json()["embedder_id"] is None
    assert client.delete(f"/v1/embedders/{setup['embedder_id']}").status_code == 204


def test_the_python_client_and_cli_flags_run_a_two_stage_search(
    setup: dict, wordnet_small: dict, tmp_path: Path
) -> None:
    from app.client.client import Client
    from tests.service.conftest import TEST_KEY

    api = Client("http://testserver", TEST_KEY, transport=setup["client"]._transport)
    found = api.search(
        setup["gallery_id"],
        wordnet_small[f"lemma.{NEW}"][Q],
        10,
        model_id=setup["model_id"],
        old_queries=wordnet_small[f"lemma.{OLD}"][Q],
        rerank_depth=20,
    )
    assert [[str(i) for i in row] for row in found.ids.tolist()] == numpy_two_stage(wordnet_small)
    assert sum(r["embedded"] for r in found.reranks) > 0
    with pytest.raises(ValueError, match="model_id"):
        api.search(setup["gallery_id"], wordnet_small[f"lemma.{NEW}"][Q], rerank=True)


def test_the_served_search_fuses_with_the_weight_its_upgrade_fitted(
    setup: dict, wordnet_small: dict
) -> None:
    """With old_vectors, the candidates are ranked by w·z(old cosine) + (1 − w)·z(new cosine),
    w and the scale from the model's upgrade report (written here, as a fit would)."""
    from app.jobs.models import UpgradeJob
    from app.models.models import TrainedModel

    client = setup["client"]
    scale = {"old_mean": 0.1, "old_std": 0.1, "new_mean": 0.05, "new_std": 0.08}
    with client.app.state.service.db.sessions() as session:
        model = session.get(TrainedModel, setup["model_id"])
        job = session.get(UpgradeJob, model.upgrade_id)
        report = dict(job.report)
        two = dict(report.get("two_stage") or {})
        two["fusion"] = {"weight": 0.4, "scale": scale}
        report["two_stage"] = two
        job.report = report
        session.commit()
    fused = search(setup, wordnet_small)
    assert fused.json()["rerank"]["fusion_weight"] == 0.4

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    ids = np.asarray([str(i) for i in wordnet_small["synset_id"][:N_GALLERY]])
    old = unit(wordnet_small[f"lemma.{OLD}"][Q]) @ unit(wordnet_small[f"gloss.{OLD}"][:N_GALLERY]).T
    new = unit(wordnet_small[f"lemma.{NEW}"][Q]) @ unit(wordnet_small[f"gloss.{NEW}"][:N_GALLERY]).T
    key = 0.4 * (old - 0.1) / 0.1 + 0.6 * (new - 0.05) / 0.08
    expected = []
    for q in range(len(Q)):
        cands = sorted(range(N_GALLERY), key=lambda j: (-old[q, j], j))[:20]
        expected.append([ids[j] for j in sorted(cands, key=lambda j: -key[q, j])[:10]])
    got = top_ids(fused)
    # Float32 scores against float64 here: the orders agree but for near ties.
    agree = np.mean(
        [a == b for ga, ea in zip(got, expected, strict=True) for a, b in zip(ga, ea, strict=True)]
    )
    assert agree > 0.97 and got != top_ids(search(setup, wordnet_small, old_vectors=None))
    # Bridged candidates (no old vectors): no fusion.
    assert search(setup, wordnet_small, old_vectors=None).json()["rerank"]["fusion_weight"] == 0.0


@pytest.mark.parametrize("setup", [{"timeout": 3.0, "pool": True}], indirect=True)
def test_a_hung_embedder_holds_no_database_connection(setup: dict, wordnet_small: dict) -> None:
    """The search waiting on the embedder has ended its transaction: with one pooled connection
    (PostgreSQL), another request is answered meanwhile instead of waiting out the pool."""
    import threading

    client = setup["client"]
    control(setup["embedder"], "hang")
    hung: dict = {}
    worker = threading.Thread(target=lambda: hung.update(r=search(setup, wordnet_small)))
    worker.start()
    try:
        import time

        time.sleep(1.0)  # the search is now waiting on the embedder
        other = client.get(f"/v1/galleries/{setup['gallery_id']}")
        assert other.status_code == 200, other.text
    finally:
        worker.join(timeout=30)
    assert hung["r"].json()["rerank"]["degraded"] == "embedder-timeout"
