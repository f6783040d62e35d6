"""Hostile request bodies that cost the server more than they cost the client (issue 24): a tiny
``.npy`` header claiming millions of rows, JSON parts nested too deep to serialise, and arrays of
the wrong rank. Each answers a 4xx problem naming the field, quickly and without a large
allocation, and changes nothing (database rows, indexes, files: compared before and after)."""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import field_names, problem
from tests.service.test_galleries_api import make_gallery, seed_vectors
from tests.service.test_hostile import NPY, npy, npy_claiming, rejected, state
from tests.service.test_upgrades_api import paired_setup, quick_upgrade

OCTET = "application/octet-stream"
CLAIMED_ROWS = 30_000_000
# Well above what a request of a few hundred bytes should cost, well below what the bug cost
# (the probe saw the API grow by ~390 MB for 30M claimed rows of '|S0').
MAX_PEAK_BYTES = 24 * 1024 * 1024
# The bug took ~5 s per request; a header check takes milliseconds (slack for a loaded CI box).
MAX_SECONDS = 2.0


def part(data: bytes) -> tuple[str, bytes, str]:
    return ("part.npy", data, OCTET)


def json_part(text: str) -> tuple[None, str, str]:
    return (None, text, "application/json")


def measured(send: Callable[[], Any]) -> tuple[Any, float, int]:
    """(response, seconds, peak bytes traced while the request ran). TestClient runs the app in
    a thread of this process, and numpy reports its buffers to tracemalloc, so the peak covers
    the whole request."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = time.perf_counter()
        response = send()
        seconds = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return response, seconds, peak


@pytest.fixture
def gallery(client: TestClient) -> str:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    return gallery_id


# ---------------------------------------------------------------------------------------------
# (a) a header claiming 30,000,000 rows: refused from the header, before numpy or a list exists
# ---------------------------------------------------------------------------------------------

# descr → what follows the header: nothing (|S0 promises 0 bytes, so "promised == held"), or a
# few bytes (<U1000000 promises 1.2e14 bytes).
CLAIMS = {
    "zero-size bytes |S0": ("|S0", b""),
    "zero-size unicode <U0": ("<U0", b""),
    "4 MB strings <U1000000": ("<U1000000", b"abcd" * 8),
    "1-byte strings |S1": ("|S1", b"a" * 64),
}
# (route kind, string field): every string part that takes a .npy.
STRING_PARTS = [
    ("gallery", "ids"),
    ("gallery", "labels"),
    ("dataset", "ids"),
    ("dataset", "labels"),
    ("queries", "ids"),
]


def _string_upload(client: TestClient, kind: str, field: str) -> Callable[[bytes], Any]:
    """A sender of multipart uploads to a new ``kind`` whose ``field`` is the bytes it is given
    and whose other parts are valid."""
    if kind == "gallery":
        gallery_id = make_gallery(client)
        url = f"/v1/galleries/{gallery_id}/vectors"
        parts = {"ids": part(npy(np.array(["a", "b"]))), "vectors": part(npy(np.ones((2, 4))))}
    elif kind == "dataset":
        dataset = client.post("/v1/datasets", json={"name": "d"}).json()
        url = f"/v1/datasets/{dataset['id']}/items"
        parts = {"ids": part(npy(np.array(["a", "b"]))), "features": part(npy(np.ones((2, 3))))}
    else:
        gallery_id = make_gallery(client)
        dataset = client.post("/v1/datasets", json={"name": "d", "gallery_id": gallery_id}).json()
        url = f"/v1/datasets/{dataset['id']}/queries"
        parts = {"ids": part(npy(np.array(["q1", "q2"]))), "features": part(npy(np.ones((2, 3))))}
    return lambda hostile: client.post(url, files={**parts, field: part(hostile)})


@pytest.mark.parametrize(("kind", "field"), STRING_PARTS, ids=[f"{k}-{f}" for k, f in STRING_PARTS])
def test_a_header_claiming_30m_strings_is_refused_before_any_allocation(
    client: TestClient, kind: str, field: str
) -> None:
    send = _string_upload(client, kind, field)
    wrong: dict[str, Any] = {}
    for claim, (descr, payload) in CLAIMS.items():
        hostile = npy_claiming((CLAIMED_ROWS,), payload, descr)
        send(hostile)  # warm-up: the first request of a route imports and caches what it needs
        before = state(client)
        response, seconds, peak = measured(partial(send, hostile))
        body = response.json()
        if not (
            400 <= response.status_code < 500
            and response.headers["content-type"].startswith("application/problem+json")
            and field in field_names(body)
            and seconds < MAX_SECONDS
            and peak < MAX_PEAK_BYTES
            and state(client) == before
        ):
            wrong[claim] = (
                response.status_code,
                body,
                f"{seconds:.2f} s",
                f"{peak / 2**20:.1f} MiB",
            )
    assert not wrong, wrong


@pytest.mark.parametrize(
    ("shape", "descr"),
    [((CLAIMED_ROWS, 0), "<f4"), ((CLAIMED_ROWS, 4), "<f4"), ((0, 10**12), "<f8")],
)
def test_a_matrix_header_beyond_the_limits_is_refused_before_any_allocation(
    client: TestClient, gallery: str, shape: tuple[int, ...], descr: str
) -> None:
    url = f"/v1/galleries/{gallery}/vectors"
    files = {
        "ids": part(npy(np.array(["a", "b"]))),
        "vectors": part(npy_claiming(shape, b"", descr)),
    }
    before = state(client)
    response, seconds, peak = measured(lambda: client.post(url, files=files))
    assert 400 <= response.status_code < 500, response.text
    assert "vectors" in field_names(rejected(client, before, response, response.status_code))
    search, _, search_peak = measured(
        lambda: client.post(
            f"/v1/galleries/{gallery}/search", content=files["vectors"][1], headers=NPY
        )
    )
    assert "vectors" in field_names(rejected(client, before, search, search.status_code))
    assert seconds < MAX_SECONDS and max(peak, search_peak) < MAX_PEAK_BYTES


def test_too_many_rows_in_a_header_is_the_row_limit(make_client) -> None:
    """Rows over MAX_VECTORS_PER_REQUEST answer the limit's own 413 from the header alone."""
    client = make_client(max_vectors_per_request=10)
    gallery_id = make_gallery(client)
    before = state(client)
    files = {
        "ids": part(npy(np.array([f"i{i}" for i in range(11)]))),
        "vectors": part(npy(np.ones((11, 4), dtype=np.float32))),
    }
    body = rejected(
        client, before, client.post(f"/v1/galleries/{gallery_id}/vectors", files=files), 413
    )
    assert body["type"] == "urn:nobackfill:problem:too-many-items"
    assert field_names(body) == ["ids"]


@pytest.mark.parametrize("descr", ["|S0", "<U0"])
def test_zero_size_strings_are_refused_at_any_row_count(
    client: TestClient, gallery: str, descr: str
) -> None:
    before = state(client)
    files = {"ids": part(npy_claiming((2,), b"", descr)), "vectors": part(npy(np.ones((2, 4))))}
    response = client.post(f"/v1/galleries/{gallery}/vectors", files=files)
    body = rejected(client, before, response, 422)
    assert field_names(body) == ["ids"] and "zero-size" in body["detail"]


# ---------------------------------------------------------------------------------------------
# (b) JSON parts nested too deep: the JSON body's depth limit, never a RecursionError
# ---------------------------------------------------------------------------------------------


def nested(depth: int) -> str:
    """An item's metadata object holding ``depth`` nested arrays."""
    return '{"a": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [900, 100_000])
def test_deep_multipart_metadata_is_refused_and_the_gallery_stays_readable(
    client: TestClient, gallery: str, depth: int
) -> None:
    before = state(client)
    files = {
        "ids": part(npy(np.array(["p1"]))),
        "vectors": part(npy(np.ones((1, 4), dtype=np.float32))),
        "metadata": json_part("[" + nested(depth) + "]"),
    }
    response = client.post(f"/v1/galleries/{gallery}/vectors", files=files)
    assert field_names(rejected(client, before, response, 422)) == ["metadata"]
    read = client.get(f"/v1/galleries/{gallery}/vectors", params={"ids": "item-0"})
    assert read.status_code == 200, read.text


@pytest.mark.parametrize("depth", [50, 150, 198, 199, 205, 900])
def test_multipart_metadata_takes_the_json_bodys_depth_limit(
    client: TestClient, gallery: str, depth: int
) -> None:
    """Either path: accepted (and then readable back, 200) or refused with 422, the same
    answer for the same metadata."""
    url = f"/v1/galleries/{gallery}/vectors"
    metadata = "[" + nested(depth) + "]"
    raw = '{"ids": ["j1"], "vectors": [[1, 0, 0, 0]], "metadata": ' + metadata + "}"
    as_json = client.post(url, content=raw, headers={"Content-Type": "application/json"})
    files = {
        "ids": part(npy(np.array(["m1"]))),
        "vectors": part(npy(np.ones((1, 4), dtype=np.float32))),
        "metadata": json_part(metadata),
    }
    as_multipart = client.post(url, files=files)
    assert as_json.status_code == as_multipart.status_code, (as_json.text, as_multipart.text)
    if as_json.status_code == 200:
        for item_id in ("j1", "m1"):
            read = client.get(url, params={"ids": item_id})
            assert read.status_code == 200, read.text
            assert read.json()["metadata"] == [json.loads(nested(depth))]
    else:
        problem(as_multipart, 422)
        assert field_names(as_multipart.json()) == ["metadata"]


def test_every_json_part_is_depth_limited(client: TestClient, gallery: str) -> None:
    """k (search), relevant_ids (queries) and a string field sent as JSON text."""
    deep = "[" * 100_000 + "]" * 100_000
    rows = part(npy(np.ones((1, 4), dtype=np.float32)))
    before = state(client)
    search = client.post(
        f"/v1/galleries/{gallery}/search", files={"vectors": rows, "k": json_part(deep)}
    )
    assert field_names(rejected(client, before, search, 422)) == ["k"]
    ids = client.post(
        f"/v1/galleries/{gallery}/vectors", files={"ids": json_part(deep), "vectors": rows}
    )
    assert field_names(rejected(client, before, ids, 422)) == ["ids"]
    dataset = client.post("/v1/datasets", json={"name": "d", "gallery_id": gallery}).json()
    before = state(client)
    queries = client.post(
        f"/v1/datasets/{dataset['id']}/queries",
        files={
            "ids": part(npy(np.array(["q1"]))),
            "features": part(npy(np.ones((1, 3)))),
            "relevant_ids": json_part(deep),
        },
    )
    assert field_names(rejected(client, before, queries, 422)) == ["relevant_ids"]


# ---------------------------------------------------------------------------------------------
# (c) 0-d and 3-d arrays on every route that takes a .npy: 422 naming the field
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (2, 2, 2)], ids=["0-d", "3-d"])
def test_arrays_of_the_wrong_rank_are_422_on_every_npy_route(
    client: TestClient, shape: tuple[int, ...]
) -> None:
    gallery_id, dataset_id = paired_setup(client)
    job = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    done = client.get(job.headers["location"]).json()
    assert done["status"] == "succeeded", done
    model_id = done["model_id"]
    bad = np.ones(shape, dtype=np.float32)
    bad_ids = np.full(shape, "x")
    gallery = f"/v1/galleries/{gallery_id}"
    routes: dict[str, tuple[str, Callable[[], Any]]] = {
        "vectors": (
            "vectors",
            lambda: client.post(
                f"{gallery}/vectors",
                files={"ids": part(npy(np.array(["a"]))), "vectors": part(npy(bad))},
            ),
        ),
        "vectors ids": (
            "ids",
            lambda: client.post(
                f"{gallery}/vectors",
                files={"ids": part(npy(bad_ids)), "vectors": part(npy(np.ones((1, 4))))},
            ),
        ),
        "vectors re-embedded": (
            "features",
            lambda: client.post(
                f"{gallery}/vectors",
                files={
                    "ids": part(npy(np.array(["item-0"]))),
                    "features": part(npy(bad)),
                    "model_id": json_part(json.dumps(model_id)),
                },
            ),
        ),
        "search": (
            "vectors",
            lambda: client.post(f"{gallery}/search", content=npy(bad), headers=NPY),
        ),
        "search multipart": (
            "vectors",
            lambda: client.post(f"{gallery}/search", files={"vectors": part(npy(bad))}),
        ),
        "search model_id": (
            "features",
            lambda: client.post(
                f"{gallery}/search", params={"model_id": model_id}, content=npy(bad), headers=NPY
            ),
        ),
        "dataset items": (
            "features",
            lambda: client.post(
                f"/v1/datasets/{dataset_id}/items",
                files={"ids": part(npy(np.array(["n1"]))), "features": part(npy(bad))},
            ),
        ),
        "queries old_vectors": (
            "old_vectors",
            lambda: client.post(
                f"/v1/datasets/{dataset_id}/queries",
                files={
                    "ids": part(npy(np.array(["q1"]))),
                    "features": part(npy(np.ones((1, 6)))),
                    "old_vectors": part(npy(bad)),
                },
            ),
        ),
        "embed": (
            "features",
            lambda: client.post(f"/v1/models/{model_id}/embed", content=npy(bad), headers=NPY),
        ),
    }
    wrong: dict[str, Any] = {}
    for route, (field, send) in routes.items():
        before = state(client)
        response = send()
        after = state(client)
        body = response.json() if response.headers.get("content-type", "").endswith("json") else {}
        if (
            response.status_code != 422
            or field not in field_names(body)
            or str(list(shape)) not in body.get("detail", "")
            or after != before
        ):
            wrong[route] = (response.status_code, response.text[:200], after == before)
    assert not wrong, wrong
