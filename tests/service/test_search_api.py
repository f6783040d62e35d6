"""Search over HTTP with the query rows as one ``.npy`` body (``application/x-npy``): the same
answers as JSON, and bad bodies refused with a problem naming the field; each hit's ``score``
(cosine for cosine galleries, the Lorentz inner product otherwise); ``vectors`` vs ``features``."""

from __future__ import annotations

import io

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import field_names, problem, snapshot
from tests.service.test_galleries_api import make_gallery, seed_vectors

NPY = {"Content-Type": "application/x-npy"}


def npy_body(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_npy_search_answers_like_json(client: TestClient, dtype: type) -> None:
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id)
    queries = (vectors[:6] + 0.05).astype(dtype)
    url = f"/v1/galleries/{gallery_id}/search"
    as_json = client.post(url, json={"vectors": queries.astype(np.float64).tolist(), "k": 4})
    as_npy = client.post(url, params={"k": 4}, content=npy_body(queries), headers=NPY)
    assert as_json.status_code == 200 and as_npy.status_code == 200, as_npy.text
    assert as_npy.json() == as_json.json()
    assert len(as_npy.json()["results"][0]) == 4


def test_npy_search_defaults_k(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id, n=30)
    url = f"/v1/galleries/{gallery_id}/search"
    body = npy_body(np.ones((2, 4), dtype=np.float32))
    results = client.post(url, content=body, headers=NPY).json()["results"]
    assert [len(r) for r in results] == [10, 10]


@pytest.mark.parametrize(
    ("body", "params", "field", "status"),
    [
        (b"not a numpy file", {}, "vectors", 422),
        (npy_body(np.ones(4, dtype=np.float32)), {}, "vectors", 422),
        (npy_body(np.ones((1, 4), dtype=np.int64)), {}, "vectors", 422),
        (npy_body(np.ones((1, 3), dtype=np.float32)), {}, "vectors", 422),
        (npy_body(np.zeros((0, 4), dtype=np.float32)), {}, "vectors", 422),
        (npy_body(np.array([[1.0, np.nan, 0.0, 0.0]])), {}, "vectors[0][1]", 422),
        (npy_body(np.array([["a", "b", "c", "d"]])), {}, "vectors", 422),
        (npy_body(np.ones((1, 4), dtype=np.float32)), {"k": 0}, "k", 422),
        (npy_body(np.ones((1, 4), dtype=np.float32)), {"k": 5000}, "k", 422),
        (npy_body(np.ones((1, 4), dtype=np.float32)), {"modality": "text"}, "modality", 422),
        (npy_body(np.ones((1, 4), dtype=np.float32)), {"modality": "a b"}, "modality", 422),
        (npy_body(np.ones((1, 4), dtype=np.float32)), {"model_id": "mdl_nope"}, None, 404),
    ],
)
def test_bad_npy_searches(
    client: TestClient, body: bytes, params: dict, field: str | None, status: int
) -> None:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    response = client.post(
        f"/v1/galleries/{gallery_id}/search", params=params, content=body, headers=NPY
    )
    errors = problem(response, status)
    if field:
        assert field in field_names(errors) or field in errors["detail"], errors


def test_object_arrays_are_never_unpickled(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    buf = io.BytesIO()
    np.save(buf, np.array([[object()]], dtype=object), allow_pickle=True)
    response = client.post(
        f"/v1/galleries/{gallery_id}/search", content=buf.getvalue(), headers=NPY
    )
    assert "vectors" in field_names(problem(response, 422))


def test_query_parameters_belong_to_npy_bodies(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    response = client.post(
        f"/v1/galleries/{gallery_id}/search", params={"k": 3}, json={"vectors": [[1, 0, 0, 0]]}
    )
    assert field_names(problem(response, 422)) == ["k"]


def test_other_media_types_are_refused(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    response = client.post(
        f"/v1/galleries/{gallery_id}/search",
        content=b"1,0,0,0",
        headers={"Content-Type": "text/csv"},
    )
    problem(response, 415)


def test_npy_search_of_another_tenants_gallery_is_not_found(client: TestClient) -> None:
    response = client.post(
        "/v1/galleries/gal_unknown/search",
        content=npy_body(np.ones((1, 4), dtype=np.float32)),
        headers=NPY,
    )
    problem(response, 404)


def test_hits_carry_a_score_that_ranks_like_the_distance(client: TestClient) -> None:
    """Cosine gallery: score = cosine(query, stored vector), and the documented formula maps the
    distance to it: cos = 1 − (cosh(√c·d) − 1)/sinh²(√c·s)."""
    gallery_id = make_gallery(client, lift_scale=1.5, curv=0.5)
    vectors = seed_vectors(client, gallery_id, n=40).astype(np.float64)
    queries = np.random.default_rng(7).normal(size=(5, 4))
    results = client.post(
        f"/v1/galleries/{gallery_id}/search", json={"vectors": queries.tolist(), "k": 40}
    ).json()["results"]
    c, s = 0.5, 1.5
    for query, hits in zip(queries, results, strict=True):
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
        for hit in hits:
            stored = vectors[int(hit["id"].split("-")[1])]
            cosine = query @ stored / (np.linalg.norm(query) * np.linalg.norm(stored))
            assert hit["score"] == pytest.approx(cosine, abs=1e-6)
            from_distance = 1 - (np.cosh(c**0.5 * hit["distance"]) - 1) / np.sinh(c**0.5 * s) ** 2
            assert hit["score"] == pytest.approx(from_distance, abs=1e-5)


def test_dot_gallery_score_is_the_lorentz_inner_product(client: TestClient) -> None:
    gallery_id = make_gallery(client, metric="dot", curv=2.0)
    seed_vectors(client, gallery_id, n=20)
    hits = client.post(
        f"/v1/galleries/{gallery_id}/search", json={"vectors": [[0.3, -0.2, 0.5, 0.1]], "k": 20}
    ).json()["results"][0]
    for hit in hits:
        assert hit["score"] == pytest.approx(-np.cosh(2.0**0.5 * hit["distance"]) / 2.0)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_features_need_a_model_and_exclude_vectors(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    url = f"/v1/galleries/{gallery_id}/search"
    before = snapshot(client)
    for body, fields in (
        ({"features": [[1, 0, 0, 0]]}, ["features"]),
        ({"vectors": [[1, 0, 0, 0]], "features": [[1, 0, 0, 0]]}, ["vectors", "features"]),
        ({"k": 3}, ["vectors"]),
    ):
        assert field_names(problem(client.post(url, json=body), 422)) == fields
    problem(client.post(url, json={"features": [[1.0] * 6], "model_id": "mdl_nope"}), 404)
    problem(
        client.post(
            url,
            params={"model_id": "mdl_nope"},
            content=npy_body(np.ones((1, 6), dtype=np.float32)),
            headers=NPY,
        ),
        404,
    )
    assert snapshot(client) == before


def test_queries_times_k_is_bounded_before_any_work(make_client) -> None:
    """Issue 45 item 6: 10,000 queries × k = 1,000 was within every limit and took 8 GB. Now
    queries × k above MAX_HITS_PER_REQUEST is a 422 naming k, for JSON and .npy bodies alike."""
    client = make_client(max_hits_per_request=100)
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    queries = np.random.default_rng(1).normal(size=(20, 4)).astype(np.float32)
    url = f"/v1/galleries/{gallery_id}/search"
    before = snapshot(client)
    refused = problem(client.post(url, json={"vectors": queries.tolist(), "k": 10}), 422)
    assert field_names(refused) == ["k"] and "MAX_HITS_PER_REQUEST" in refused["detail"]
    npy = client.post(
        url,
        content=npy_body(queries),
        params={"k": 10},
        headers={"Content-Type": "application/x-npy"},
    )
    assert field_names(problem(npy, 422)) == ["k"]
    assert snapshot(client) == before
    # At the bound exactly: answered.
    answered = client.post(url, json={"vectors": queries[:10].tolist(), "k": 10})
    assert answered.status_code == 200 and len(answered.json()["results"]) == 10
