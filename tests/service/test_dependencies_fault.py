"""Dependencies that hang or fill up (issue 45 item 7).

- A wedged PostgreSQL (connections open, nothing answers) — a proxy in front of the real server,
  frozen after the start — turns requests into 503 with Retry-After within seconds: libpq's
  ``connect_timeout``, a bounded pre-ping, and a client-side read timeout (``statement_timeout``
  is the server's and cannot fire when the server does not answer). A silent Redis holds
  neither /readyz nor the creation of an upgrade (that one is in ``test_jobs.py``).
- A full disk (ENOSPC; EDQUOT and EFBIG alike) answers 507 problem+json and changes nothing: no
  row, no segment byte, no index file. Injected at the file layer, at SQLite's page limit
  (SQLITE_FULL), and — where this machine lets the test mount one — on a real, full tmpfs.
- The API starts on a full disk: the startup check keeps the index it could not write in
  memory, searches are served, writes answer 507, /readyz says ``read-only``, and writes resume
  once space is back.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select, text

from app.core.db import Database
from app.core.settings import Settings
from app.main import create_app
from bench.common.fault_proxy import FreezableProxy
from tests.service.conftest import TEST_KEY, empty_database, problem, snapshot, wait_until
from tests.service.test_galleries_api import make_gallery, npy, seed_vectors

NO_SPACE = [errno.ENOSPC, errno.EDQUOT, errno.EFBIG]


@pytest.fixture
def wedgeable_postgres(postgres_url: str) -> Iterator[tuple[str, FreezableProxy]]:
    """The session's migrated PostgreSQL database, emptied, reached through a freezable proxy."""
    empty_database(postgres_url)
    proxy = FreezableProxy(("127.0.0.1", 5432))
    host_part = postgres_url.split("@", 1)[1].split("/", 1)[0]
    try:
        yield postgres_url.replace(f"@{host_part}/", f"@127.0.0.1:{proxy.port}/"), proxy
    finally:
        proxy.thaw()
        proxy.stop()


START_DEFAULTS: dict[str, Any] = {
    "vector_engine": "faiss",
    "job_runner": "inline",
    "bootstrap_key": TEST_KEY,
    "local_key": False,
    "log_level": "warning",
}


def start(tmp_path: Path, **overrides: Any) -> TestClient:
    values: dict[str, Any] = {"data_dir": tmp_path / "data", **START_DEFAULTS, **overrides}
    client = TestClient(
        create_app(Settings(_env_file=None, **values)), raise_server_exceptions=False
    )
    client.__enter__()
    client.headers["Authorization"] = f"Bearer {TEST_KEY}"
    return client


# The read timeout well above the others: a 503 within seconds shows the bounded pre-ping and
# connect at work (each new request checks out a connection); the in-flight test lowers it.
WEDGE_BOUNDS = {"db_connect_timeout_s": 2, "db_ping_timeout_s": 1.0, "db_read_timeout_s": 30.0}


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    tic = time.monotonic()
    result = call()
    return result, time.monotonic() - tic


def test_a_wedged_postgres_answers_503_with_retry_after_within_seconds(
    tmp_path: Path, wedgeable_postgres: tuple[str, FreezableProxy]
) -> None:
    url, proxy = wedgeable_postgres
    client = start(tmp_path, database_url=url, **WEDGE_BOUNDS)
    try:
        gallery_id = make_gallery(client)
        seed_vectors(client, gallery_id)
        assert client.get("/v1/galleries").status_code == 200
        proxy.freeze()
        for path in ("/v1/galleries", f"/v1/galleries/{gallery_id}"):
            response, elapsed = timed(lambda p=path: client.get(p))
            body = problem(response, 503)
            assert response.headers["Retry-After"] == "5", body
            # pre-ping (1 s) + a reconnect the frozen server never answers (2 s), with slack
            assert elapsed < 6, elapsed
        ready, elapsed = timed(lambda: client.get("/readyz", headers={"Authorization": ""}))
        assert problem(ready, 503)["detail"].startswith("database does not answer")
        assert elapsed < 6, elapsed
        assert client.get("/healthz", headers={"Authorization": ""}).status_code == 200
        proxy.thaw()
        # The pool drops what the wedge left behind and reconnects: the next requests succeed.
        recovered = client.get(f"/v1/galleries/{gallery_id}")
        assert recovered.status_code == 200, recovered.text
        assert recovered.json()["count"] == 20
    finally:
        proxy.thaw()
        client.__exit__(None, None, None)


def test_a_statement_in_flight_when_postgres_wedges_ends_at_the_read_timeout(
    tmp_path: Path, wedgeable_postgres: tuple[str, FreezableProxy]
) -> None:
    """The pre-ping only guards a checkout: a connection already in use when the server wedges
    is ended by the client-side read timeout and invalidated, not held forever."""
    from sqlalchemy.exc import DBAPIError

    url, proxy = wedgeable_postgres
    settings = Settings(
        _env_file=None,
        data_dir=tmp_path,
        database_url=url,
        **{**WEDGE_BOUNDS, "db_read_timeout_s": 3},
    )
    db = Database(settings)
    try:
        with db.engine.connect() as connection:
            # A statement longer than the pre-ping's bound, shorter than the read timeout, passes.
            connection.execute(text("SELECT pg_sleep(1.5)"))
            proxy.freeze()
            tic = time.monotonic()
            with pytest.raises(DBAPIError) as raised:
                connection.execute(text("SELECT 1"))
            assert time.monotonic() - tic < 5
            assert raised.value.connection_invalidated
            assert "did not answer within 3 s" in str(raised.value)
        proxy.thaw()
        with db.engine.connect() as connection:
            assert connection.execute(text("SELECT 1")).scalar() == 1
    finally:
        proxy.thaw()
        db.dispose()


@pytest.mark.faiss_only("the Celery runner with Milvus needs a Milvus server (none in tests)")
def test_readyz_with_a_silent_redis_answers_503_within_seconds(
    make_client: Callable[..., TestClient],
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # never accepted: connects complete, nothing is ever answered
    try:
        port = listener.getsockname()[1]
        client = make_client(job_runner="celery", redis_url=f"redis://127.0.0.1:{port}/0")
        ready, elapsed = timed(lambda: client.get("/readyz", headers={"Authorization": ""}))
    finally:
        listener.close()
    assert problem(ready, 503)["detail"].startswith("redis does not answer")
    assert elapsed < 4, elapsed


# -- a full disk, injected at the file layer ---------------------------------------------------------
def no_space(number: int) -> OSError:
    return OSError(number, os.strerror(number))


def full_segments(monkeypatch: pytest.MonkeyPatch, number: int = errno.ENOSPC) -> None:
    """Segment writes take half their bytes, then fail as a full disk does."""
    from app.vectors.faiss import segments

    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] == 1 and len(data) > 1:
            return real(fd, bytes(data[: len(data) // 2]), offset)
        raise no_space(number)

    monkeypatch.setattr(segments.os, "pwrite", pwrite)


def full_index_files(monkeypatch: pytest.MonkeyPatch, number: int = errno.ENOSPC) -> None:
    """Index files fail midway through, after their temp file got some bytes; so does the
    probe write that tells whether space is back."""
    from app.core import files, storage
    from app.vectors.faiss import index_store

    def probe(directory: Path, size: int = 0) -> None:
        raise no_space(number)

    monkeypatch.setattr(storage, "probe", probe)
    monkeypatch.setattr(storage, "available_bytes", lambda directory: 0)

    def write(path: Path, content: Callable[[Any], object]) -> None:
        def half(fh: Any) -> None:
            fh.write(b"partial index bytes")
            raise no_space(number)

        files.write_atomically_with(path, half)

    monkeypatch.setattr(index_store, "write_atomically_with", write)


def upload(client: TestClient, gallery_id: str, first: int, n: int = 10) -> Any:
    vectors = np.random.default_rng(first).normal(size=(n, 4)).astype(np.float32)
    ids = [f"new-{first + i}" for i in range(n)]
    return client.post(
        f"/v1/galleries/{gallery_id}/vectors", json={"ids": ids, "vectors": vectors.tolist()}
    )


def readiness(client: TestClient) -> dict[str, Any]:
    ready = client.get("/readyz", headers={"Authorization": ""})
    assert ready.status_code == 200, ready.text
    return ready.json()


def becomes_ready(client: TestClient) -> None:
    """/readyz says ready within seconds. A probe of the index flusher's, made within
    ``recheck_s`` before a call, is answered as it stands: a load balancer asks again."""
    wait_until(lambda: readiness(client)["status"] == "ready", 5.0, "/readyz to say ready")


def _wrapped(error: BaseException) -> RuntimeError:
    try:
        raise RuntimeError("a library's own error") from error
    except RuntimeError as wrapper:
        return wrapper


def _pg_disk_full() -> BaseException:
    import psycopg.errors
    from sqlalchemy.exc import OperationalError

    orig = psycopg.errors.DiskFull('could not extend file "base/16384/16385"')
    return OperationalError("INSERT INTO galleries …", {}, orig)


def _sqlite(message: str) -> BaseException:
    from sqlalchemy.exc import OperationalError

    return OperationalError("INSERT …", {}, sqlite3.OperationalError(message))


@pytest.mark.parametrize(
    ("error", "full"),
    [
        (no_space(errno.ENOSPC), True),
        (no_space(errno.EDQUOT), True),
        (no_space(errno.EFBIG), True),
        (_wrapped(no_space(errno.ENOSPC)), True),
        (_pg_disk_full(), True),
        (_sqlite("database or disk is full"), True),
        (no_space(errno.EACCES), False),
        (no_space(errno.EIO), False),
        (_sqlite("database is locked"), False),
        (RuntimeError("no"), False),
    ],
)
def test_a_full_disk_is_recognised_through_its_wrappers(error: BaseException, full: bool) -> None:
    from app.core.storage import is_no_space

    assert is_no_space(error) is full


@pytest.mark.faiss_only("the database's own disk: the same handler for any vector engine")
def test_a_full_postgresql_disk_answers_507(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's disk_full (SQLSTATE 53100) on the commit: 507 naming the database."""
    from app.galleries import service

    gallery_id = make_gallery(client)

    def full(*args: Any, **kwargs: Any) -> None:
        raise _pg_disk_full()

    monkeypatch.setattr(service, "upsert_vectors", full)
    body = problem(upload(client, gallery_id, 0), 507)
    assert "database" in body["detail"]


@pytest.mark.faiss_only("segment and index files are FAISS-engine storage")
@pytest.mark.parametrize("number", NO_SPACE, ids=[errno.errorcode[n] for n in NO_SPACE])
def test_a_full_disk_under_a_segment_write_answers_507_and_changes_nothing(
    make_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch, number: int
) -> None:
    client = make_client(storage_recheck_s=0.01)
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    before = snapshot(client)
    with monkeypatch.context() as patch:
        full_segments(patch, number)
        full_index_files(patch, number)
        response = upload(client, gallery_id, 100)
        body = problem(response, 507)
        assert body["type"] == "urn:nobackfill:problem:insufficient-storage"
        assert snapshot(client) == before  # no row, no segment byte, no index file
        # Searches are still served.
        found = client.post(
            f"/v1/galleries/{gallery_id}/search", json={"vectors": [[1, 0, 0, 0]], "k": 3}
        )
        assert found.status_code == 200, found.text
        ready = readiness(client)
        assert ready["status"] == "read-only" and ready["checks"]["storage"].startswith("full")
    # Space is back: the next write succeeds, and /readyz's probe clears the state. The index
    # flusher's own recheck may have probed (still patched) within recheck_s of this call, and
    # /readyz then answers that probe's state: ask again, as a load balancer does.
    assert upload(client, gallery_id, 100).status_code == 200
    becomes_ready(client)
    assert client.get(f"/v1/galleries/{gallery_id}").json()["count"] == 30


@pytest.mark.faiss_only("index files are FAISS-engine storage")
def test_an_index_file_the_full_disk_refused_is_written_once_space_is_back(
    make_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index file is written after the commit (a cache of the stored rows): a full disk
    there must not turn a stored write into an error, nor leave a partial file; it is written
    by a later flush."""
    client = make_client(index_flush_interval_s=0, storage_recheck_s=0.01)
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id)
    store = client.app.state.service.indexes
    index_dir = client.app.state.service.settings.index_dir
    files_before = sorted(p.name for p in index_dir.iterdir())
    with monkeypatch.context() as patch:
        full_index_files(patch)
        stored = upload(client, gallery_id, 200)
        assert stored.status_code == 200, stored.text
        assert sorted(p.name for p in index_dir.iterdir()) == files_before  # no temp, no part
        found = client.post(
            f"/v1/galleries/{gallery_id}/search", json={"vectors": [[1, 0, 0, 0]], "k": 30}
        )
        assert {hit["id"] for hit in found.json()["results"][0]} >= {
            f"new-{200 + i}" for i in range(10)
        }
        assert store.flush() == []  # still full: stays dirty
        assert readiness(client)["status"] == "read-only"
    assert store.flush() == [gallery_id]
    assert [p.name for p in index_dir.iterdir() if p.name.startswith(gallery_id)] == [
        store.path(gallery_id, store.current_version(gallery_id)).name
    ]
    assert readiness(client)["status"] == "ready"


@pytest.mark.faiss_only("segment and index files are FAISS-engine storage")
def test_the_api_starts_on_a_full_disk_read_only_and_writes_resume(
    make_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: after a crash on a full disk the startup index rebuild hit ENOSPC and the API
    did not start at all."""
    first = make_client()
    gallery_id = make_gallery(first)
    vectors = seed_vectors(first, gallery_id)
    index_dir = first.app.state.service.settings.index_dir
    first.__exit__(None, None, None)
    for file in index_dir.iterdir():
        file.unlink()  # stale after the crash: the startup check must rebuild it
    with monkeypatch.context() as patch:
        full_index_files(patch)
        full_segments(patch)
        client = make_client(storage_recheck_s=0.01)
        ready = readiness(client)
        assert ready["status"] == "read-only", ready
        assert "index file" in ready["checks"]["storage"]
        found = client.post(
            f"/v1/galleries/{gallery_id}/search", json={"vectors": vectors[:2].tolist(), "k": 1}
        )
        assert found.status_code == 200, found.text
        assert [row[0]["id"] for row in found.json()["results"]] == ["item-0", "item-1"]
        problem(upload(client, gallery_id, 300), 507)
        assert list(index_dir.iterdir()) == []
    # Space is back: the write goes through and the flusher (or shutdown) writes the index.
    assert upload(client, gallery_id, 300).status_code == 200
    becomes_ready(client)
    client.app.state.service.indexes.flush()
    assert [p.name for p in index_dir.iterdir()] == [
        client.app.state.service.indexes.path(
            gallery_id, client.app.state.service.indexes.current_version(gallery_id)
        ).name
    ]


def test_a_full_sqlite_database_answers_507_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLITE_FULL ("database or disk is full"), made real by SQLite's own page limit."""
    client = start(tmp_path, vector_storage="sql", storage_recheck_s=0.01)
    try:
        gallery_id = make_gallery(client)
        seed_vectors(client, gallery_id)
        before = snapshot(client)
        engine = client.app.state.service.db.engine
        with engine.connect() as connection:
            pages = connection.execute(text("PRAGMA page_count")).scalar()

        def cap(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.execute(f"PRAGMA max_page_count = {int(pages)}")

        event.listen(engine, "connect", cap)
        engine.dispose()  # every new connection gets the cap
        try:
            response = upload(client, gallery_id, 400, n=2000)
            problem(response, 507)
            assert snapshot(client) == before
        finally:
            event.remove(engine, "connect", cap)
            engine.dispose()
        assert upload(client, gallery_id, 400, n=2000).status_code == 200
    finally:
        client.__exit__(None, None, None)


# -- a real full disk: a small tmpfs -----------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs (root only: mount needs it; skipped elsewhere)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` up to its last byte; returns the filler to delete."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (2**16, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def committed(client: TestClient) -> dict[str, Any]:
    """``snapshot``, with each segment file's bytes up to the length its committed manifest
    names. A write whose segment bytes fit but whose commit failed (SQLite could not grow its
    WAL) leaves them past the committed end: never read, cut off by the gallery's next write or
    the startup check. Cutting them at once is unsafe: the commit failed, so the row lock is
    gone and another process's writer may already be appending there."""
    from app.galleries.models import Gallery

    result = snapshot(client)
    state = client.app.state.service
    files = {}
    with state.db.sessions() as session:
        for gallery_id, manifest in session.execute(select(Gallery.id, Gallery.vector_manifest)):
            for segment in (manifest or {}).get("segments", []):
                path = state.settings.data_dir / "vectors" / gallery_id / segment["name"]
                data = path.read_bytes()[: segment["bytes"]]
                files[f"{gallery_id}/{segment['name']}"] = hashlib.sha256(data).hexdigest()
    result["vector_files"] = files
    return result


def test_a_real_full_disk_starts_read_only_refuses_writes_with_507_and_recovers(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = {"data_dir": small_disk / "data", "storage_recheck_s": 0.01}
    first = start(small_disk, **overrides)
    gallery_id = make_gallery(first)
    vectors = seed_vectors(first, gallery_id)
    wide = make_gallery(first, name="wide", dim=64)
    index_dir = first.app.state.service.settings.index_dir
    first.__exit__(None, None, None)
    for file in index_dir.iterdir():
        file.unlink()
    # What a crash leaves: SQLite's WAL and its index (-shm) beside the database, as a process
    # still holding it keeps them. (After a clean shutdown SQLite removes both, and on a disk
    # without a byte free it cannot make its 32 KiB index again to read at all.)
    holder = sqlite3.connect(small_disk / "data" / "nobackfill.db")
    holder.execute("SELECT count(*) FROM galleries").fetchone()
    filler = fill(small_disk)
    # Uploads spool large parts to temp files: those are on the full disk too.
    spool = small_disk / "tmp"
    spool.mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    client = start(small_disk, **overrides)
    try:
        ready = readiness(client)
        assert ready["status"] == "read-only", ready
        found = client.post(
            f"/v1/galleries/{gallery_id}/search", json={"vectors": vectors[:2].tolist(), "k": 1}
        )
        assert found.status_code == 200, found.text
        assert [row[0]["id"] for row in found.json()["results"]] == ["item-0", "item-1"]
        before = committed(client)
        problem(upload(client, gallery_id, 500), 507)
        # 5,000 × 64 float64: 2.5 MB, past the 1 MiB a part is kept in memory: spooled to disk.
        big = np.random.default_rng(1).normal(size=(5_000, 64))
        files = {
            "ids": ("ids.npy", npy(np.array([f"b{i}" for i in range(5_000)])), "application/x-npy"),
            "vectors": ("v.npy", npy(big), "application/x-npy"),
        }
        spooled = problem(client.post(f"/v1/galleries/{wide}/vectors", files=files), 507)
        assert "data directory" in spooled["detail"]
        assert committed(client) == before
        filler.unlink()
        assert upload(client, gallery_id, 500).status_code == 200
        becomes_ready(client)
        stored = client.post(f"/v1/galleries/{wide}/vectors", files=files)
        assert stored.status_code == 200, stored.text
    finally:
        client.__exit__(None, None, None)
        holder.close()


def test_a_start_on_a_disk_without_a_byte_free_says_why_it_fails(small_disk: Path) -> None:
    """After a clean stop SQLite has removed its WAL and WAL index; with no byte free it cannot
    make them again to read at all: the start fails, naming the full disk (not "disk I/O
    error"), and succeeds once a little space is back."""
    overrides = {"data_dir": small_disk / "data"}
    first = start(small_disk, **overrides)
    make_gallery(first)
    first.__exit__(None, None, None)
    filler = fill(small_disk)
    app = create_app(Settings(_env_file=None, **{**START_DEFAULTS, **overrides}))
    with pytest.raises(RuntimeError, match="is full"), TestClient(app):
        pass
    filler.unlink()
    again = start(small_disk, **overrides)
    assert again.get("/v1/galleries").json()["items"][0]["name"] == "products"
    again.__exit__(None, None, None)
