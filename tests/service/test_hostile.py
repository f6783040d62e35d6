"""Hostile input: every rejected request answers an RFC 9457 problem (4xx, never 5xx) and leaves
the database rows, the in-memory indexes, the index files and the data directory as they were
(compared before and after, not assumed). Complements the per-endpoint cases in
test_galleries_api, test_search_api and test_datasets_api."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from numpy.lib import format as npy_format

from tests.service.conftest import field_names, problem, snapshot
from tests.service.test_galleries_api import make_gallery, seed_vectors

NPY = {"Content-Type": "application/x-npy"}


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_claiming(shape: tuple[int, ...], payload: bytes, descr: str = "<f4") -> bytes:
    """A well-formed ``.npy`` header promising ``shape`` followed by ``payload``."""
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + payload


def data_files(client: TestClient) -> dict[str, str]:
    """Every file under the data directory but the database's own (SQLite's WAL and shared
    memory change on reads): a traversal would show up here as a new or changed file."""
    root: Path = client.app.state.service.settings.data_dir
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith("nobackfill.db")
    }


def state(client: TestClient) -> dict[str, Any]:
    return {**snapshot(client), "data_files": data_files(client)}


def rejected(client: TestClient, before: dict[str, Any], response: Any, status: int) -> dict:
    body = problem(response, status)
    assert state(client) == before
    return body


def post_raw(client: TestClient, url: str, raw: str | bytes) -> Any:
    """POST a JSON body exactly as written (literals json.dumps would refuse or escape)."""
    return client.post(url, content=raw, headers={"Content-Type": "application/json"})


@pytest.fixture
def gallery(client: TestClient) -> str:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    return gallery_id


SIX_FLOATS = np.ones(8, dtype=np.float32).tobytes()
GOOD_ROWS = npy(np.ones((2, 4), dtype=np.float32))
MALFORMED_NPY = {
    # The header promises far more than follows: numpy would allocate it all before reading.
    "claims 10^12 rows": npy_claiming((10**12, 4), SIX_FLOATS),
    "claims 10^8 rows": npy_claiming((10**8, 4), SIX_FLOATS),
    "header cut short": GOOD_ROWS[:30],
    "data cut short": GOOD_ROWS[:-5],
    "trailing bytes": GOOD_ROWS + b"\x00" * 7,
    "header not a dict": GOOD_ROWS[:10] + b"[1, 2, 3]".ljust(len(GOOD_ROWS) - 10),
    "object dtype in header": npy_claiming((2, 4), b"\x80\x04" * 16, descr="|O"),
    "int64 values": npy(np.ones((2, 4), dtype=np.int64)),
    "bool values": npy(np.ones((2, 4), dtype=bool)),
    "strings as vectors": npy(np.array([["a", "b", "c", "d"]] * 2)),
    "version 9": b"\x93NUMPY\x09\x00" + GOOD_ROWS[8:],
}


@pytest.mark.parametrize("case", list(MALFORMED_NPY))
def test_malformed_npy_vectors_change_nothing(client: TestClient, gallery: str, case: str) -> None:
    before = state(client)
    files = {
        "ids": ("ids.npy", npy(np.array(["x", "y"])), "application/octet-stream"),
        "vectors": ("v.npy", MALFORMED_NPY[case], "application/octet-stream"),
    }
    response = client.post(f"/v1/galleries/{gallery}/vectors", files=files)
    assert "vectors" in field_names(rejected(client, before, response, 422))


@pytest.mark.parametrize("case", ["claims 10^12 rows", "header cut short", "data cut short"])
def test_malformed_npy_searches_and_ids_change_nothing(
    client: TestClient, gallery: str, case: str
) -> None:
    before = state(client)
    search = client.post(
        f"/v1/galleries/{gallery}/search", content=MALFORMED_NPY[case], headers=NPY
    )
    assert "vectors" in field_names(rejected(client, before, search, 422))
    files = {
        "ids": ("ids.npy", MALFORMED_NPY[case], "application/octet-stream"),
        "vectors": ("v.npy", GOOD_ROWS, "application/octet-stream"),
    }
    upload = client.post(f"/v1/galleries/{gallery}/vectors", files=files)
    assert "ids" in field_names(rejected(client, before, upload, 422))


def test_malformed_npy_dataset_features_change_nothing(client: TestClient) -> None:
    dataset = client.post("/v1/datasets", json={"name": "d", "modalities": ["image", "text"]})
    url = f"/v1/datasets/{dataset.json()['id']}/items"
    before = state(client)
    files = {
        "ids": ("ids.npy", npy(np.array(["a", "b"])), "application/octet-stream"),
        "modalities.image": ("i.npy", GOOD_ROWS, "application/octet-stream"),
        "modalities.text": ("t.npy", MALFORMED_NPY["claims 10^12 rows"], "x"),
    }
    response = client.post(url, files=files)
    assert "modalities.text" in field_names(rejected(client, before, response, 422))


NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e39"]


@pytest.mark.parametrize("literal", NON_FINITE)
def test_non_finite_queries_and_features(client: TestClient, gallery: str, literal: str) -> None:
    before = state(client)
    raw = '{"vectors": [[1, 0, 0, 0], [0, ' + literal + ', 0, 0]], "k": 2}'
    search = post_raw(client, f"/v1/galleries/{gallery}/search", raw)
    assert "vectors[1][1]" in field_names(rejected(client, before, search, 422))
    dataset = client.post("/v1/datasets", json={"name": f"d-{literal}"}).json()
    before = state(client)
    raw = '{"ids": ["a"], "features": [[1, ' + literal + "]]}"
    upload = post_raw(client, f"/v1/datasets/{dataset['id']}/items", raw)
    assert "features[0][1]" in field_names(rejected(client, before, upload, 422))


@pytest.mark.parametrize(
    ("body", "field", "status"),
    [
        ({"ids": ["a"], "vectors": [[0.5] * 5000]}, "vectors[0]", 422),
        ({"ids": ["a", "b"], "vectors": [[1, 2, 3, 4], [[1, 2], 3, 4, 5]]}, "vectors", 422),
        ({"ids": ["a", "b"], "vectors": [[1, 2, 3, 4], 5]}, "vectors", 422),
        ({"ids": ["a"], "vectors": [[1, 2, 3, 4], []]}, "vectors", 422),
        ({"ids": ["a"], "vectors": [[True, 2, 3, 4]]}, "vectors", 422),
        ({"ids": ["a"], "vectors": [[None, 2, 3, 4]]}, "vectors", 422),
        ({"ids": ["a"], "vectors": [["1", 2, 3, 4]]}, "vectors[0][0]", 422),
        ({"ids": [1], "vectors": [[1, 2, 3, 4]]}, "ids", 422),
        ({"ids": ["a"] * 11, "vectors": [[1, 2, 3, 4]] * 11}, "ids", 413),
    ],
)
def test_ragged_wrong_and_huge_json_arrays(
    make_client, body: dict, field: str, status: int
) -> None:
    client = make_client(max_vectors_per_request=10)
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id, n=5)
    before = state(client)
    errors = rejected(
        client, before, client.post(f"/v1/galleries/{gallery_id}/vectors", json=body), status
    )
    assert any(f.startswith(field) for f in field_names(errors)), errors


def test_deeply_nested_json_is_refused(client: TestClient, gallery: str) -> None:
    before = state(client)
    raw = '{"ids": ["a"], "vectors": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = post_raw(client, f"/v1/galleries/{gallery}/vectors", raw)
    rejected(client, before, response, 422)


def test_oversized_multipart_and_npy_bodies(make_client) -> None:
    client = make_client(max_request_bytes=4096)
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id, n=5)
    before = state(client)
    rows = np.ones((300, 4), dtype=np.float32)
    files = {
        "ids": ("ids.npy", npy(np.array([f"i{i}" for i in range(300)])), "x"),
        "vectors": ("v.npy", npy(rows), "x"),
    }
    upload = client.post(f"/v1/galleries/{gallery_id}/vectors", files=files)
    assert "exceeds the limit of 4096" in rejected(client, before, upload, 413)["detail"]
    search = client.post(f"/v1/galleries/{gallery_id}/search", content=npy(rows), headers=NPY)
    rejected(client, before, search, 413)


TRAVERSAL = [
    "../../../etc/passwd",
    "..%2F..%2Fetc%2Fpasswd",
    "%2e%2e%2f%2e%2e%2findexes",
    "gal_x%00.v1.npz",
    "....//....//x",
    "C:%5Cwindows%5Csystem32",
]


@pytest.mark.parametrize("name", TRAVERSAL)
def test_path_traversal_in_urls(client: TestClient, gallery: str, name: str) -> None:
    before = state(client)
    for method, path, body in [
        ("GET", f"/v1/galleries/{name}", None),
        ("POST", f"/v1/galleries/{name}/vectors", {"ids": ["a"], "vectors": [[1, 0, 0, 0]]}),
        ("DELETE", f"/v1/galleries/{name}", None),
        ("GET", f"/v1/datasets/{name}", None),
        ("GET", f"/v1/models/{name}", None),
    ]:
        response = client.request(method, path, json=body)
        assert 400 <= response.status_code < 500, (path, response.status_code)
        rejected(client, before, response, response.status_code)


@pytest.mark.parametrize(
    "name", ["../../etc/passwd", "..\\..\\windows", "..", ".", "a/../../b", "x\x00.v1.npz"]
)
def test_path_traversal_in_names(client: TestClient, gallery: str, name: str) -> None:
    before = state(client)
    gallery_body = {"name": name, "dim": 4, "model_name": "m", "metric": "cosine"}
    for resource, body in [("galleries", gallery_body), ("datasets", {"name": name})]:
        created = client.post(f"/v1/{resource}", json=body)
        assert "name" in field_names(rejected(client, before, created, 422))


UNICODE_IDS = [
    "日本語の商品",
    "ünïcödé",
    "e\u0301",  # "é" decomposed: a different id from the composed "é"
    "é",
    "עברית-RTL",
    "emoji-🧪🚀",
    "zero\u200bwidth",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]


def test_unicode_ids_round_trip_and_stay_distinct(client: TestClient, gallery: str) -> None:
    vectors = np.eye(len(UNICODE_IDS), 4, dtype=np.float32) + 0.01 * np.arange(
        len(UNICODE_IDS) * 4, dtype=np.float32
    ).reshape(-1, 4)
    response = client.post(
        f"/v1/galleries/{gallery}/vectors",
        json={"ids": UNICODE_IDS, "vectors": vectors.tolist()},
    )
    assert response.json() == {"upserted": len(UNICODE_IDS), "count": 20 + len(UNICODE_IDS)}
    found = client.post(
        f"/v1/galleries/{gallery}/search", json={"vectors": vectors.tolist(), "k": 1}
    )
    assert [row[0]["id"] for row in found.json()["results"]] == UNICODE_IDS
    deleted = client.request(
        "DELETE", f"/v1/galleries/{gallery}/vectors", json={"ids": ["e\u0301"]}
    )
    assert deleted.json() == {"deleted": 1, "count": 20 + len(UNICODE_IDS) - 1}


@pytest.mark.parametrize(
    "raw_id",
    [
        '"\\ud800"',  # a lone surrogate: not a character, cannot be stored as UTF-8
        '"a\\u0000b"',
        '"\\u202e\\u0007"',
        '"' + "長" * 300 + '"',
    ],
)
def test_bad_unicode_ids_change_nothing(client: TestClient, gallery: str, raw_id: str) -> None:
    before = state(client)
    raw = '{"ids": [' + raw_id + '], "vectors": [[1, 0, 0, 0]]}'
    response = post_raw(client, f"/v1/galleries/{gallery}/vectors", raw.encode())
    assert field_names(rejected(client, before, response, 422)), response.text


def test_invalid_utf8_bodies_change_nothing(client: TestClient, gallery: str) -> None:
    before = state(client)
    for content in (b'{"ids": ["\xff\xfe"], "vectors": [[1, 0, 0, 0]]}', b"\xff" * 64):
        response = post_raw(client, f"/v1/galleries/{gallery}/vectors", content)
        rejected(client, before, response, 422)
    names = {
        "ids": ("ids.npy", npy(np.array([b"\xff\xfe"])), "x"),
        "vectors": ("v", GOOD_ROWS[:0], "x"),
    }
    response = client.post(f"/v1/galleries/{gallery}/vectors", files=names)
    rejected(client, before, response, 422)
    metadata = {"ids": json.dumps(["a"]), "metadata": "{not json"}
    response = client.post(
        f"/v1/galleries/{gallery}/vectors",
        data=metadata,
        files={"vectors": ("v.npy", npy(np.ones((1, 4), np.float32)), "x")},
    )
    rejected(client, before, response, 422)


NUL, URL_NUL = "a\x00b", "a%00b"
NUL_REQUESTS = [
    ("GET", f"/v1/galleries/{URL_NUL}", None),
    ("GET", f"/v1/datasets/{URL_NUL}", None),
    ("GET", f"/v1/upgrades/{URL_NUL}", None),
    ("POST", f"/v1/upgrades/{URL_NUL}/cancel", None),
    ("GET", f"/v1/models/{URL_NUL}", None),
    ("POST", f"/v1/models/{URL_NUL}/embed", {"features": [[1.0]]}),
    ("GET", f"/v1/galleries?page_token={URL_NUL}", None),
    ("POST", "/v1/galleries", {"name": "n", "dim": 4, "model_name": NUL, "metric": "cosine"}),
    ("POST", "/v1/galleries", {"name": "n", "model_id": NUL}),
    ("POST", "/v1/datasets", {"name": "n", "gallery_id": NUL}),
    ("POST", "/v1/upgrades", {"dataset_id": NUL, "method": "procrustes"}),
    ("POST", "/v1/upgrades", {"dataset_id": NUL, "method": "hmcl-ca", "base_model_id": NUL}),
]


@pytest.mark.parametrize(("method", "url", "body"), NUL_REQUESTS)
def test_nul_bytes_anywhere_are_client_errors(
    client: TestClient, gallery: str, method: str, url: str, body: dict | None
) -> None:
    """PostgreSQL text cannot hold NUL: one reaching a query used to be a 500 there."""
    before = state(client)
    response = client.request(method, url, json=body)
    assert 400 <= response.status_code < 500, response.text
    rejected(client, before, response, response.status_code)
    search = {"vectors": [[1, 0, 0, 0]], "model_id": NUL}
    rejected(client, before, client.post(f"/v1/galleries/{gallery}/search", json=search), 404)
