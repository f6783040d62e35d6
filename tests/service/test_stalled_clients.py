"""Slow and stalled clients cannot starve the others (issue 24, failure 1): 20 connections each
promising a 100,000-byte upload and sending 14 bytes made every other request wait 30 s for a
pooled database connection, then answer 500. The key check held its connection, inside an open
transaction, for the whole request, and the upload routes looked the gallery up before reading
the body."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from app.auth.service import create_key
from app.core.db import Database
from app.core.settings import Settings
from bench.common.service import BENCH_KEY, RunningService, start_service

STALLED = 50


def _stall(url: str, path: str, key: str, body: bytes = b'{"ids": ["a"],') -> socket.socket:
    """Open a connection that promises 100,000 bytes of body, sends ``body``, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _other_tenant(data_dir: Path) -> str:
    db = Database(Settings(_env_file=None, data_dir=data_dir))
    with db.session() as session:
        key = create_key(session, "other-tenant").key
    db.dispose()
    return key


def _gallery(service: RunningService) -> str:
    with service.client(timeout=60) as client:
        created = client.post(
            "/v1/galleries", json={"name": "g", "dim": 2, "model_name": "m", "metric": "cosine"}
        )
        assert created.status_code == 201, created.text
        return created.json()["id"]


@pytest.mark.slow
def test_fifty_stalled_uploads_leave_every_other_tenant_answering(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    # Caps far above the stalled count: every stalled upload is admitted and waits for its body,
    # so what is shown is that waiting holds nothing the others need.
    env = {
        "NOBACKFILL_BODY_IDLE_TIMEOUT_S": "120",
        "NOBACKFILL_MAX_CONCURRENT_UPLOADS": "200",
        "NOBACKFILL_MAX_CONCURRENT_UPLOADS_PER_KEY": "200",
    }
    service = start_service(data_dir, env, 120)
    sockets: list[socket.socket] = []
    try:
        gallery = _gallery(service)
        other_key = _other_tenant(data_dir)
        for i in range(STALLED):
            path = (
                f"/v1/galleries/{gallery}/vectors" if i % 2 else f"/v1/galleries/{gallery}/search"
            )
            sockets.append(_stall(service.url, path, BENCH_KEY))
        time.sleep(1.0)  # every stalled request has reached its route and waits for its body
        headers = {"Authorization": f"Bearer {other_key}"}
        with httpx.Client(base_url=service.url, timeout=5, headers=headers) as other:
            for path in ("/healthz", "/v1/galleries", "/readyz", "/v1/datasets", "/v1/galleries"):
                tic = time.monotonic()
                try:
                    answered = other.get(path)
                except httpx.TimeoutException:
                    pytest.fail(f"GET {path} did not answer while {STALLED} uploads stalled")
                assert answered.status_code == 200, (path, answered.text)
                assert time.monotonic() - tic < 1.0, path
            # Another tenant's upload goes through too.
            theirs = other.post(
                "/v1/galleries", json={"name": "h", "dim": 2, "model_name": "m", "metric": "cosine"}
            )
            assert theirs.status_code == 201, theirs.text
            stored = other.post(
                f"/v1/galleries/{theirs.json()['id']}/vectors",
                json={"ids": ["x"], "vectors": [[1.0, 0.0]]},
            )
            assert stored.status_code == 200, stored.text
        # Nothing of the stalled bodies was stored.
        with service.client(timeout=10) as client:
            assert client.get(f"/v1/galleries/{gallery}").json()["count"] == 0
    finally:
        for sock in sockets:
            sock.close()
        service.stop()


@pytest.mark.slow
def test_a_stalled_body_times_out_and_surplus_uploads_are_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {
        "NOBACKFILL_BODY_IDLE_TIMEOUT_S": "1",
        "NOBACKFILL_MAX_CONCURRENT_UPLOADS": "50",
        "NOBACKFILL_MAX_CONCURRENT_UPLOADS_PER_KEY": "2",
    }
    service = start_service(data_dir, env, 120)
    try:
        gallery = _gallery(service)
        other_key = _other_tenant(data_dir)
        path = f"/v1/galleries/{gallery}/vectors"
        first, second = _stall(service.url, path, BENCH_KEY), _stall(service.url, path, BENCH_KEY)
        time.sleep(0.3)
        # A third body from the same key: refused at once, before any of it is read.
        third = _stall(service.url, path, BENCH_KEY)
        status, headers, body = _response(third)
        assert status == 429 and headers["retry-after"] == "1", body
        assert json.loads(body)["status"] == 429
        # Another key is not held back by the first key's uploads.
        with httpx.Client(base_url=service.url, timeout=5) as other:
            ok = other.post(
                path,
                json={"ids": ["x"], "vectors": [[1.0, 0.0]]},
                headers={"Authorization": f"Bearer {other_key}"},
            )
            assert ok.status_code == 404, ok.text  # its own tenant has no such gallery
        # The stalled bodies: 408 problem+json after the idle timeout, nothing stored.
        for sock in (first, second):
            status, headers, body = _response(sock)
            assert status == 408, body
            assert headers["content-type"].startswith("application/problem+json")
            assert "NOBACKFILL_BODY_IDLE_TIMEOUT_S" in json.loads(body)["detail"]
        with service.client(timeout=10) as client:
            assert client.get(f"/v1/galleries/{gallery}").json()["count"] == 0
            # The key's slots are free again.
            stored = client.post(path, json={"ids": ["a"], "vectors": [[1.0, 0.0]]})
            assert stored.status_code == 200, stored.text
    finally:
        service.stop()


def _response(sock: socket.socket) -> tuple[int, dict[str, str], str]:
    """Read one HTTP response from a raw socket (until the server closes it or 10 s pass)."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    sock.close()
    return status, headers, rest.decode()
