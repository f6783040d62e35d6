"""Issue 45 item 6: large search answers streamed as NDJSON in bounded chunks, on real WordNet
vectors (old: MiniLM glosses), both databases and both vector engines."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.search import service
from tests.service.conftest import problem, snapshot
from tests.service.test_backfill_api import N_GALLERY, upgraded
from tests.service.test_queries_api import NEW, OLD, npy

NDJSON = {"Accept": "application/x-ndjson"}
HITS_PER_CHUNK = 50  # MAX_HITS_PER_REQUEST in these tests: 5 queries of k = 10 a chunk


def _gallery(client: TestClient, wordnet_small) -> str:
    gallery = client.post(
        "/v1/galleries", json={"name": "g", "dim": 384, "model_name": OLD, "metric": "cosine"}
    ).json()
    sent = client.post(
        f"/v1/galleries/{gallery['id']}/vectors",
        files={
            "ids": npy(wordnet_small["synset_id"][:N_GALLERY]),
            "vectors": npy(wordnet_small[f"gloss.{OLD}"][:N_GALLERY]),
        },
    )
    assert sent.status_code == 200, sent.text
    return gallery["id"]


def _lines(response) -> list[dict]:
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def _json_hits(client: TestClient, url: str, body: dict, n: int, per: int = 5) -> list:
    """The same search as JSON answers of ``per`` queries each (each within the limit)."""
    out = []
    for start in range(0, n, per):
        part = {
            key: value[start : start + per] if isinstance(value, list) else value
            for key, value in body.items()
        }
        answer = client.post(url, json=part)
        assert answer.status_code == 200, answer.text
        out += answer.json()["results"]
    return out


def test_an_answer_past_the_json_limit_streams_in_chunks_equal_to_json(
    make_client, wordnet_small
) -> None:
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    url = f"/v1/galleries/{_gallery(client, wordnet_small)}/search"
    queries = wordnet_small[f"lemma.{OLD}"][:23]
    body = {"vectors": queries.tolist(), "k": 10}
    assert problem(client.post(url, json=body), 422)["errors"][0]["field"] == "k"
    streamed = client.post(url, json=body, headers=NDJSON)
    assert streamed.status_code == 200, streamed.text
    lines = _lines(streamed)
    assert lines[-1] == {"done": True, "queries": 23, "k": 10}
    assert [line["query"] for line in lines[:-1]] == list(range(23))
    assert [line["hits"] for line in lines[:-1]] == _json_hits(client, url, body, 23)
    # A .npy body streams alike.
    npy_body = client.post(
        f"{url}?k=10",
        content=npy(queries)[1],
        headers=NDJSON | {"Content-Type": "application/x-npy"},
    )
    assert _lines(npy_body) == lines
    # JSON stays the default; JSON first in Accept is JSON.
    for accept in ("application/json", "application/json, application/x-ndjson", "*/*"):
        small = client.post(url, json={"vectors": queries[:3].tolist()}, headers={"Accept": accept})
        assert small.headers["content-type"].startswith("application/json"), accept


def test_a_transition_search_streams_its_old_vectors_chunk_by_chunk(
    make_client, wordnet_small
) -> None:
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}/search"
    body = {
        "model_id": setup["model_id"],
        "features": wordnet_small[f"lemma.{NEW}"][:12].tolist(),
        "old_vectors": wordnet_small[f"lemma.{OLD}"][:12].tolist(),
        "k": 10,
    }
    lines = _lines(client.post(url, json=body, headers=NDJSON))
    assert lines[-1]["done"] is True
    assert [line["hits"] for line in lines[:-1]] == _json_hits(client, url, body, 12)


def test_what_a_request_gets_wrong_is_still_a_problem_and_two_stage_is_not_streamed(
    make_client, wordnet_small
) -> None:
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    gallery_id = _gallery(client, wordnet_small)
    url = f"/v1/galleries/{gallery_id}/search"
    before = snapshot(client)
    rows = wordnet_small[f"lemma.{OLD}"][:8].tolist()
    missing = client.post("/v1/galleries/gal_nope/search", json={"vectors": rows}, headers=NDJSON)
    assert problem(missing, 404)
    narrow = client.post(url, json={"vectors": [r[:5] for r in rows]}, headers=NDJSON)
    assert problem(narrow, 422)
    too_big_k = client.post(url, json={"vectors": rows, "k": 5000}, headers=NDJSON)
    assert problem(too_big_k, 422)["errors"][0]["field"] == "k"
    rerank = {"model_id": "mdl_x", "features": rows, "rerank": {}}
    assert problem(client.post(url, json=rerank, headers=NDJSON), 406)
    assert snapshot(client) == before


@pytest.mark.faiss_only
def test_a_failure_after_the_first_chunk_ends_the_stream_with_an_error_line(
    make_client, wordnet_small, monkeypatch
) -> None:
    client = make_client(max_hits_per_request=HITS_PER_CHUNK)
    url = f"/v1/galleries/{_gallery(client, wordnet_small)}/search"
    real = service.search_gallery
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("database gone")
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "search_gallery", failing)
    rows = wordnet_small[f"lemma.{OLD}"][:20].tolist()
    answer = client.post(url, json={"vectors": rows, "k": 10}, headers=NDJSON)
    assert answer.status_code == 200
    lines = _lines(answer)
    assert [line["query"] for line in lines[:-1]] == list(range(10))
    assert lines[-1] == {
        "error": {"status": 503, "detail": "the search failed mid-answer", "queries_sent": 10}
    }
    assert not any(line.get("done") for line in lines)
    assert np.isfinite([h["distance"] for line in lines[:-1] for h in line["hits"]]).all()
