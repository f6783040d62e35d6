"""The Python client against a real server process (uvicorn, embedded SQLite, thread runner)
with small request limits, so that uploads and searches must find them and batch by them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.client import ApiError, Client, InputError, NoServerError, UploadInterrupted
from app.client.uploads import BatchLimits, RowParts
from bench.common.service import BENCH_KEY, RunningService, start_service

OLD, NEW = "gloss.all-MiniLM-L6-v2", "gloss.all-mpnet-base-v2"
MAX_ROWS = 300
MAX_BYTES = 256 * 1024
QUICK = {"epochs": 2, "hidden_dim": 32}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    env = {
        "NOBACKFILL_JOB_RUNNER": "thread",
        "NOBACKFILL_MAX_VECTORS_PER_REQUEST": str(MAX_ROWS),
        "NOBACKFILL_MAX_REQUEST_BYTES": str(MAX_BYTES),
    }
    service = start_service(tmp_path_factory.mktemp("client") / "data", env, startup_timeout=120)
    yield service
    service.stop()


def require_route(server: RunningService, path: str) -> None:
    """Fail, never skip, when the server does not serve ``path``: a missing endpoint is a bug."""
    paths = httpx.get(f"{server.url}/openapi.json", timeout=30).json()["paths"]
    assert path in paths, f"{path} is not served"


class RecordingTransport(httpx.HTTPTransport):
    """Sends for real; records every upload batch's acknowledged row count, and can fail the
    n-th upload batch with a connection error before it leaves (an interruption)."""

    def __init__(self, fail_batch: int | None = None, fail_with: str = "connect") -> None:
        super().__init__()
        self.fail_batch = fail_batch
        self.fail_with = fail_with
        self.batches = 0
        self.acknowledged: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        is_upload = request.method == "POST" and request.url.path.endswith(("/vectors", "/items"))
        if is_upload:
            self.batches += 1
            if self.batches == self.fail_batch:
                if self.fail_with == "503":
                    return httpx.Response(503, text="upstream restarting", request=request)
                raise httpx.ConnectError("connection refused (injected)", request=request)
        response = super().handle_request(request)
        if is_upload and response.status_code == 200:
            response.read()
            self.acknowledged.append(json.loads(response.content)["upserted"])
        return response


def make_client(server: RunningService, tmp_path: Path, **kwargs: Any) -> Client:
    return Client(
        server.url,
        BENCH_KEY,
        checkpoint_dir=tmp_path / "checkpoints",
        retry_backoff_s=0.01,
        **kwargs,
    )


def external_gallery(client: Client, dim: int, name: str) -> str:
    return client.create_gallery(name, dim=dim, model_name="all-MiniLM-L6-v2", metric="cosine")[
        "id"
    ]


def test_uploads_find_the_servers_limits_and_search_returns_arrays(
    server: RunningService, tmp_path: Path, wordnet_small: dict
) -> None:
    ids, labels, old = wordnet_small["synset_id"], wordnet_small["label"], wordnet_small[OLD]
    transport = RecordingTransport()
    with make_client(server, tmp_path, transport=transport) as client:
        gallery_id = external_gallery(client, old.shape[1], "limits")
        result = client.upload_vectors(gallery_id, ids, old, labels)
        assert result["upserted"] == result["count"] == len(ids)
        assert result["resumed_from"] == 0
        # 384-d rows: the byte limit binds first; a 413 named it and the client kept under it.
        assert client.limits.bytes <= MAX_BYTES
        assert sum(transport.acknowledged) == len(ids)
        assert (
            result["batches"]
            == len(transport.acknowledged)
            >= len(ids) * old[0].nbytes // MAX_BYTES
        )
        assert client.get_gallery(gallery_id)["count"] == len(ids)

        # 8-d rows: now the row limit binds.
        small_id = external_gallery(client, 8, "rows-limit")
        small = client.upload_vectors(small_id, ids, old[:, :8])
        assert client.limits.rows == MAX_ROWS
        assert small["count"] == len(ids) and small["batches"] == -(-len(ids) // MAX_ROWS)

        # 800 queries need several .npy bodies under these limits; rows come back in order.
        found = client.search(gallery_id, old, k=3)
        assert found.ids.shape == found.distances.shape == (len(ids), 3)
        assert (found.ids[:, 0] == ids).all()
        assert np.allclose(found.distances[:, 0], 0, atol=1e-3)
        assert (np.diff(found.distances, axis=1) >= 0).all()
        assert (found.labels[:, 0] == labels).all()


def test_an_interrupted_upload_resumes_without_resending_acknowledged_batches(
    server: RunningService, tmp_path: Path
) -> None:
    rng = np.random.default_rng(1)
    ids = np.array([f"item-{i}" for i in range(1000)])
    vectors = rng.normal(size=(1000, 16)).astype(np.float32)
    first = RecordingTransport(fail_batch=3)
    with make_client(server, tmp_path, transport=first, retries=0, batch_rows=200) as client:
        gallery_id = external_gallery(client, 16, "resume")
        with pytest.raises(UploadInterrupted) as interrupted:
            client.upload_vectors(gallery_id, ids, vectors)
        assert interrupted.value.rows_done == 400 == sum(first.acknowledged)
        assert client.get_gallery(gallery_id)["count"] == 400
    assert len(list((tmp_path / "checkpoints").glob("*.json"))) == 1

    second = RecordingTransport()
    seen: list[tuple[int, int]] = []
    with make_client(server, tmp_path, transport=second, batch_rows=200) as client:
        result = client.upload_vectors(
            gallery_id, ids, vectors, progress=lambda done, total: seen.append((done, total))
        )
        assert result == {"upserted": 600, "count": 1000, "batches": 3, "resumed_from": 400}
        # Only the rows the first run did not get acknowledged were sent again.
        assert second.acknowledged == [200, 200, 200]
        assert seen[0] == (400, 1000) and seen[-1] == (1000, 1000)
        assert client.get_gallery(gallery_id)["count"] == 1000
    assert list((tmp_path / "checkpoints").glob("*.json")) == []

    # Other data under the same ids is another upload: nothing is skipped for it.
    third = RecordingTransport()
    with make_client(server, tmp_path, transport=third, batch_rows=250) as client:
        result = client.upload_vectors(gallery_id, ids, vectors + 1)
        assert result["resumed_from"] == 0 and third.acknowledged == [250] * 4


def test_a_503_is_retried_and_the_upload_completes(server: RunningService, tmp_path: Path) -> None:
    ids = np.array([f"r{i}" for i in range(90)])
    vectors = np.random.default_rng(2).normal(size=(90, 8)).astype(np.float32)
    transport = RecordingTransport(fail_batch=2, fail_with="503")
    with make_client(server, tmp_path, transport=transport, batch_rows=30) as client:
        gallery_id = external_gallery(client, 8, "retry")
        result = client.upload_vectors(gallery_id, ids, vectors)
    assert result == {"upserted": 90, "count": 90, "batches": 3, "resumed_from": 0}
    assert transport.batches == 4 and transport.acknowledged == [30, 30, 30]


class LostAnswerTransport(httpx.HTTPTransport):
    """Delivers the n-th access upload to the server, then loses its answer (a read error):
    the server counted the batch, the client cannot know it."""

    def __init__(self, lose: int) -> None:
        super().__init__()
        self.lose, self.sent, self.keys = lose, 0, []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/access"):
            self.sent += 1
            self.keys.append(request.headers.get("Idempotency-Key"))
            if self.sent == self.lose:
                response.read()
                raise httpx.ReadError("connection reset (injected)", request=request)
        return response


def test_an_access_batch_whose_answer_was_lost_is_counted_once(
    server: RunningService, tmp_path: Path
) -> None:
    ids = np.array([f"a{i}" for i in range(60)])
    vectors = np.random.default_rng(3).normal(size=(60, 8)).astype(np.float32)
    transport = LostAnswerTransport(lose=2)
    with make_client(server, tmp_path, transport=transport, batch_rows=30) as client:
        gallery_id = external_gallery(client, 8, "clicks")
        client.upload_vectors(gallery_id, ids, vectors)
        result = client.upload_access(gallery_id, ids, np.arange(60))
    # Batch 2 was sent twice (its answer lost), with the same key: counted once.
    assert transport.sent == 3 and transport.keys[1] == transport.keys[2] != transport.keys[0]
    assert result["total"] == int(np.arange(60).sum()) and result["batches"] == 2


def test_problem_details_become_api_errors(server: RunningService, tmp_path: Path) -> None:
    with make_client(server, tmp_path) as client:
        with pytest.raises(ApiError) as bad:
            client.create_gallery("x", dim=0, model_name="m", metric="cosine")
        assert bad.value.status == 422 and bad.value.title == "Invalid request"
        assert "dim" in bad.value.field_errors
        with pytest.raises(ApiError) as missing:
            client.get_gallery("gal_nope")
        assert missing.value.status == 404 and "gal_nope" in missing.value.detail
        assert "Not found (404)" in str(missing.value)
        gallery_id = external_gallery(client, 4, "problems")
        with pytest.raises(ApiError) as too_long:
            client.upload_vectors(gallery_id, ["x" * 300], np.ones((1, 4), np.float32))
        assert too_long.value.status == 422 and "ids[0]" in too_long.value.field_errors
        assert client.get_gallery(gallery_id)["count"] == 0
    with Client(server.url, "nbk_wrong_key_" + "x" * 32) as stranger, pytest.raises(ApiError) as no:
        stranger.galleries()
    assert no.value.status == 401


@pytest.mark.parametrize(
    ("ids", "vectors", "message"),
    [
        (np.arange(3), np.ones((3, 4), np.float32), "ids: expected strings"),
        (np.array(["a", "b", "c"]), np.ones((3, 4), np.int64), "expected float16/32/64"),
        (np.array(["a", "b", "c"]), np.ones((3, 5), np.float32), "but gallery"),
        (np.array(["a", "b", "c"]), np.ones((2, 4), np.float32), "2 rows, but there are 3 ids"),
        (np.array(["a", "b", "a"]), np.ones((3, 4), np.float32), "1 ids repeat"),
        (np.array(["a", "b", "c"]), np.array([[1, 0, 0, np.nan]] * 3), "row 0 holds NaN"),
        (np.array([["a"], ["b"], ["c"]]), np.ones((3, 4), np.float32), "1-D array"),
    ],
)
def test_bad_input_is_refused_before_anything_is_sent(
    server: RunningService, tmp_path: Path, ids: np.ndarray, vectors: np.ndarray, message: str
) -> None:
    transport = RecordingTransport()
    with make_client(server, tmp_path, transport=transport) as client:
        gallery_id = external_gallery(client, 4, f"refused-{uuid.uuid4().hex[:8]}")
        with pytest.raises(InputError, match=message):
            client.upload_vectors(gallery_id, ids, vectors)
        assert transport.batches == 0
        assert client.get_gallery(gallery_id)["count"] == 0


def test_creates_with_the_same_idempotency_key_create_once(
    server: RunningService, tmp_path: Path
) -> None:
    with make_client(server, tmp_path) as client:
        first = client.create_gallery(
            "once", dim=4, model_name="m", metric="cosine", idempotency_key="create-once-1"
        )
        again = client.create_gallery(
            "once", dim=4, model_name="m", metric="cosine", idempotency_key="create-once-1"
        )
        assert again["id"] == first["id"]
        assert [g["id"] for g in client.galleries() if g["name"] == "once"] == [first["id"]]


@pytest.fixture(scope="module")
def paired(server: RunningService, wordnet_small: dict, tmp_path_factory) -> tuple[str, str]:
    """A gallery of the old vectors and a dataset of the new features of 600 of its items."""
    ids, old, new = wordnet_small["synset_id"], wordnet_small[OLD], wordnet_small[NEW]
    with make_client(server, tmp_path_factory.mktemp("paired")) as client:
        gallery_id = external_gallery(client, old.shape[1], "paired")
        client.upload_vectors(gallery_id, ids, old, wordnet_small["label"])
        dataset = client.create_dataset("mpnet", gallery_id=gallery_id)
        items = client.upload_items(dataset["id"], ids[:600], new[:600])
        assert items["count"] == 600
        assert client.get_dataset(dataset["id"])["dims"] == {"default": new.shape[1]}
        return gallery_id, dataset["id"]


def test_upgrade_wait_reports_progress_and_the_model_searches_the_old_gallery(
    server: RunningService, tmp_path: Path, paired: tuple[str, str], wordnet_small: dict
) -> None:
    gallery_id, dataset_id = paired
    ids, new = wordnet_small["synset_id"], wordnet_small[NEW]
    with make_client(server, tmp_path) as client:
        assert "procrustes" in json.dumps(client.methods())
        job = client.create_upgrade(dataset_id, "procrustes", params=QUICK)
        assert job["status"] in ("queued", "running")
        polls: list[dict] = []
        done = client.wait_upgrade(job["id"], poll_s=0.2, timeout_s=300, on_progress=polls.append)
        assert done["status"] == "succeeded", done["error"]
        assert polls[-1] == done and done["model_id"]
        # Held-out items (not in the dataset): new-backbone features find their own old vector.
        found = client.search(gallery_id, new[600:], k=10, model_id=done["model_id"])
        assert found.ids.shape == (200, 10)
        recall = np.mean([ids[600 + i] in found.ids[i] for i in range(200)])
        assert recall > 0.9, recall


def test_cancel_stops_a_job(
    server: RunningService, tmp_path: Path, paired: tuple[str, str]
) -> None:
    _, dataset_id = paired
    with make_client(server, tmp_path) as client:
        job = client.create_upgrade(dataset_id, "hbct", params={"epochs": 500, "hidden_dim": 32})
        client.cancel_upgrade(job["id"])
        done = client.wait_upgrade(job["id"], poll_s=0.2, timeout_s=120)
        assert done["status"] == "cancelled"
        slow = client.create_upgrade(dataset_id, "hbct", params={"epochs": 500})
        with pytest.raises(TimeoutError, match=slow["id"]):
            client.wait_upgrade(slow["id"], poll_s=0.1, timeout_s=0.3)
        client.cancel_upgrade(slow["id"])
        assert client.wait_upgrade(slow["id"], poll_s=0.2, timeout_s=120)["status"] == "cancelled"


def test_queries_upload_in_batches(
    server: RunningService, tmp_path: Path, paired: tuple[str, str], wordnet_small: dict
) -> None:
    require_route(server, "/v1/datasets/{dataset_id}/queries")
    _, dataset_id = paired
    ids, old, new = wordnet_small["synset_id"], wordnet_small[OLD], wordnet_small[NEW]
    query_ids = np.array([f"q{i}" for i in range(100)])
    relevant = [[str(ids[600 + i])] for i in range(100)]
    transport = RecordingTransport()
    with make_client(server, tmp_path, transport=transport, batch_rows=40) as client:
        result = client.upload_queries(
            dataset_id, query_ids, new[600:700], old_vectors=old[600:700], relevant_ids=relevant
        )
    assert result["upserted"] == 100 and result["batches"] == 3


def test_batch_limits_follow_413_details() -> None:
    parts = RowParts({"ids": np.array(["a"] * 100), "vectors": np.ones((100, 256), np.float32)})
    limits = BatchLimits()
    assert limits.rows_for(parts) == limits.rows == 10_000
    assert limits.rows_for(parts, batch_size=7) == 7
    assert limits.lower_from("ids: 5000 items exceed the limit of 300 per request", 5000, parts)
    assert limits.rows == 300
    assert limits.lower_from("request body exceeds the limit of 102400 bytes", 300, parts)
    assert limits.rows_for(parts) == (int(102400 * 0.9) - parts.fixed_bytes()) // parts.row_bytes()
    assert limits.lower_from("no number here", 10, parts) and limits.rows == 5
    assert not limits.lower_from("no number here", 1, parts)


def test_the_local_key_file_is_used_for_a_server_on_this_machine_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "api_key").write_text("nbk_local_key_from_the_data_dir\n")
    (tmp_path / "server_url").write_text("http://127.0.0.1:8123\n")
    monkeypatch.setenv("NOBACKFILL_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("NOBACKFILL_KEY", raising=False)
    monkeypatch.delenv("NOBACKFILL_URL", raising=False)
    with Client() as local:
        assert local.url == "http://127.0.0.1:8123"
        assert local.key == "nbk_local_key_from_the_data_dir"
    with Client("https://nobackfill.example.com") as remote:
        assert remote.key is None and "Authorization" not in remote.http.headers
    monkeypatch.setenv("NOBACKFILL_KEY", "nbk_from_env")
    monkeypatch.setenv("NOBACKFILL_URL", "http://localhost:9000/")
    with Client() as configured:
        assert (configured.url, configured.key) == ("http://localhost:9000", "nbk_from_env")


def test_the_client_finds_the_server_nobackfill_serve_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``NOBACKFILL_PORT=8100 make serve`` then ``nobackfill …``: the CLI reaches that server
    (it once sent the key to 127.0.0.1:8000); NOBACKFILL_URL and --url still win."""
    import uvicorn

    from app import cli
    from app.core import settings as settings_module

    monkeypatch.setenv("NOBACKFILL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("NOBACKFILL_PORT", "8100")
    monkeypatch.setenv("NOBACKFILL_HOST", "0.0.0.0")
    monkeypatch.delenv("NOBACKFILL_URL", raising=False)
    monkeypatch.delenv("NOBACKFILL_KEY", raising=False)
    settings_module.get_settings.cache_clear()
    started: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(kw))
    monkeypatch.setattr("app.main.create_app", lambda settings: object())
    try:
        assert cli.main(["serve"]) == 0
    finally:
        settings_module.get_settings.cache_clear()
    assert started["port"] == 8100
    # Bound to every interface: the client on this machine reaches it on the loopback.
    assert (tmp_path / "server_url").read_text().strip() == "http://127.0.0.1:8100"
    (tmp_path / "api_key").write_text("nbk_local_key_from_the_data_dir\n")
    with Client() as local:
        assert local.url == "http://127.0.0.1:8100"
        assert local.key == "nbk_local_key_from_the_data_dir"
    with Client("http://127.0.0.1:9999") as explicit:
        assert explicit.url == "http://127.0.0.1:9999"
    monkeypatch.setenv("NOBACKFILL_URL", "http://localhost:9000")
    with Client() as configured:
        assert configured.url == "http://localhost:9000"


def test_gallery_get_prints_a_migrations_progress_per_model() -> None:
    from app.client.commands import describe_gallery

    gallery = {
        "name": "docs",
        "dim": 4,
        "kind": "external",
        "model_name": "old",
        "metric": "cosine",
        "model_id": None,
        "count": 1000,
        "reembedded": [{"model_id": "mdl_a", "reembedded": 250, "total": 1000, "fraction": 0.25}],
    }
    assert "re-embedded for mdl_a: 250/1000 (25%)" in describe_gallery(gallery)
    assert "re-embedded" not in describe_gallery({**gallery, "reembedded": []})


class SkippingTransport(httpx.HTTPTransport):
    """Sends for real; the first upload batch's answer also names ids as skipped, as an attached
    collection's answer does for points deleted since the plan listed them."""

    def __init__(self, skipped: list[str]) -> None:
        super().__init__()
        self.skipped = skipped
        self.batches = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/vectors"):
            self.batches += 1
            if self.batches == 1 and response.status_code == 200:
                body = json.loads(response.read()) | {"skipped": self.skipped}
                return httpx.Response(200, json=body, request=request)
        return response


def test_skipped_ids_of_every_batch_are_reported_and_not_counted_as_upserted(
    server: RunningService, tmp_path: Path
) -> None:
    from app.client.commands import upload_summary

    rng = np.random.default_rng(2)
    ids = np.array([f"item-{i}" for i in range(500)])
    vectors = rng.normal(size=(500, 8)).astype(np.float32)
    transport = SkippingTransport(["item-3", "item-7"])
    with make_client(server, tmp_path, transport=transport, batch_rows=200) as client:
        gallery_id = external_gallery(client, 8, "skipped")
        result = client.upload_vectors(gallery_id, ids, vectors)
    assert result["skipped"] == ["item-3", "item-7"] and result["upserted"] == 498
    text = upload_summary(result, "re-embedded items")
    assert "498 re-embedded items upserted" in text
    assert "2 skipped" in text and "item-3" in text and "item-7" in text


def test_with_no_server_named_the_client_does_not_guess_a_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 44 item 6: outside the folder make serve ran in, the client tried 127.0.0.1:8000
    (another service's port here) and answered 401. With no --url, NOBACKFILL_URL or recorded
    server_url it now refuses, naming each way to give one, and the CLI exits 1 with that
    message before any request."""
    from app.cli import main

    monkeypatch.chdir(tmp_path)  # no data/server_url here
    monkeypatch.delenv("NOBACKFILL_URL", raising=False)
    monkeypatch.delenv("NOBACKFILL_DATA_DIR", raising=False)
    with pytest.raises(NoServerError, match="NOBACKFILL_URL") as refused:
        Client()
    assert "--url" in str(refused.value) and "NOBACKFILL_DATA_DIR" in str(refused.value)
    assert main(["gallery", "list"]) == 1
    err = capsys.readouterr().err
    assert "no server named" in err and "NOBACKFILL_URL" in err
    monkeypatch.setenv("NOBACKFILL_URL", "http://127.0.0.1:9001")
    with Client() as named:
        assert named.url == "http://127.0.0.1:9001"
