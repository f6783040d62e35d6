"""Identify before reading (issue 45, item 2), on a real server process and raw sockets: the key
is checked when the headers arrive, before any body is read. Before, the per-key upload cap hashed
the ``Authorization`` header as sent and routes read their body before the key was checked, so
one key in many letter cases of "Bearer", or junk keys, filled the global cap and every other
tenant's upload got 429; and a body sent without a key was read (and parsed) before its 401."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.common.service import BENCH_KEY, RunningService, start_service
from tests.service.test_stalled_clients import _gallery, _other_tenant

CAP, PER_KEY = 6, 2


@pytest.fixture
def service(tmp_path: Path) -> Iterator[RunningService]:
    env = {
        "NOBACKFILL_BODY_IDLE_TIMEOUT_S": "60",
        "NOBACKFILL_MAX_CONCURRENT_UPLOADS": str(CAP),
        "NOBACKFILL_MAX_CONCURRENT_UPLOADS_PER_KEY": str(PER_KEY),
        # Junk keys must be refused, not throttled, within this test.
        "NOBACKFILL_AUTH_FAILURE_LIMIT": "1000",
    }
    running = start_service(tmp_path / "data", env, 120)
    yield running
    running.stop()


def promise(url: str, path: str, authorization: str | None, length: int = 100_000) -> socket.socket:
    """A connection that promises ``length`` bytes of body and sends a few, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    auth = f"Authorization: {authorization}\r\n" if authorization is not None else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"ids": ["a"],')
    return sock


def status_within(sock: socket.socket, seconds: float) -> int | None:
    """The answer's status code if one arrives within ``seconds``, else None (still waiting)."""
    sock.settimeout(seconds)
    try:
        data = sock.recv(4096)
    except TimeoutError:
        return None
    return int(data.split(b" ", 2)[1]) if data else None


def others_upload(service: RunningService, key: str) -> int:
    with httpx.Client(
        base_url=service.url, timeout=10, headers={"Authorization": f"Bearer {key}"}
    ) as other:
        created = other.post(
            "/v1/galleries", json={"name": "h", "dim": 2, "model_name": "m", "metric": "cosine"}
        )
        assert created.status_code == 201, created.text
        stored = other.post(
            f"/v1/galleries/{created.json()['id']}/vectors",
            json={"ids": ["x"], "vectors": [[1.0, 0.0]]},
        )
        return stored.status_code


@pytest.mark.slow
def test_one_key_in_many_spellings_is_one_key(service: RunningService, tmp_path: Path) -> None:
    path = f"/v1/galleries/{_gallery(service)}/vectors"
    other_key = _other_tenant(tmp_path / "data")
    spellings = ["Bearer", "bearer", "BEARER", "bEARER", "BeArEr", "bearER"]
    sockets = [promise(service.url, path, f"{scheme} {BENCH_KEY}") for scheme in spellings]
    try:
        statuses = [status_within(sock, 1.5) for sock in sockets]
        # The first two wait for their bodies; the others are the same key: 429 at once.
        assert statuses.count(None) == PER_KEY, statuses
        assert sorted(s for s in statuses if s is not None) == [429] * (CAP - PER_KEY)
        assert others_upload(service, other_key) == 200
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.slow
def test_junk_keys_and_no_key_are_refused_before_their_bodies(
    service: RunningService, tmp_path: Path
) -> None:
    path = f"/v1/galleries/{_gallery(service)}/vectors"
    other_key = _other_tenant(tmp_path / "data")
    junk = [promise(service.url, path, f"Bearer junk-{i}") for i in range(CAP + 2)]
    # No key, 60 MB promised: answered without a byte more being read.
    bare = promise(service.url, path, None, length=60_000_000)
    sockets = [*junk, bare]
    try:
        tic = time.monotonic()
        assert [status_within(sock, 3.0) for sock in sockets] == [401] * len(sockets)
        assert time.monotonic() - tic < 6.0
        assert others_upload(service, other_key) == 200
    finally:
        for sock in sockets:
            sock.close()
