"""Request headers bounded in size and time (issue 45, item 3), on a real ``nobackfill serve``
process over raw sockets: a header past MAX_HEADER_BYTES answers 431 at once and closes; headers
that do not finish within HEADER_TIMEOUT_S answer 408 and close (also on a kept-alive
connection's next request); other clients are answered meanwhile; ordinary requests and large
bodies are untouched."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.serve_process import nobackfill_serve

KEY = "nbk_bounds_test_" + "c" * 32


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, int]]:
    with nobackfill_serve(
        tmp_path / "data", KEY, max_header_bytes="8192", header_timeout_s="1.0"
    ) as running:
        yield running


def _read_all(sock: socket.socket, limit_s: float = 5.0) -> bytes:
    sock.settimeout(limit_s)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def test_an_oversized_header_is_431_at_once(served: tuple[str, int]) -> None:
    _, port = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000)
        answer = _read_all(sock)
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
    assert b"MAX_HEADER_BYTES" in answer and elapsed < 0.9  # before the header timeout


def test_headers_that_never_finish_are_408_while_others_are_served(
    served: tuple[str, int],
) -> None:
    url, port = served
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
    try:
        for sock in slow:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        for _ in range(3):
            for sock in slow:
                sock.sendall(b"X-Drip: 1\r\n")
            assert httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            time.sleep(0.2)
        answers = [_read_all(sock) for sock in slow]
        elapsed = time.monotonic() - started
    finally:
        for sock in slow:
            sock.close()
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[0][:80]
    assert elapsed < 3.0


def test_a_kept_alive_connections_next_headers_are_bounded_too(served: tuple[str, int]) -> None:
    _, port = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        rest = _read_all(sock)
    # The first answer (its body may arrive after its head), then the 408 for the second.
    answers = (first + rest).split(b"HTTP/1.1 ")[1:]
    assert [a[:3] for a in answers] == [b"200", b"408"], answers


def test_ordinary_requests_and_large_bodies_are_untouched(served: tuple[str, int]) -> None:
    url, _ = served
    headers = {f"X-Extra-{i}": "v" * 60 for i in range(80)}  # ~6 KB, under the bound
    assert httpx.get(f"{url}/healthz", headers=headers).status_code == 200
    body = {"name": "g", "dim": 4, "model_name": "m", "metric": "cosine", "pad": "x" * 300_000}
    big = httpx.post(
        f"{url}/v1/galleries", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )
    assert big.status_code == 422 and "pad" in big.text  # the body's own problem, not 431


def test_connections_per_address_are_bounded(tmp_path: Path) -> None:
    """Issue 45 item 3's last part: one address may hold MAX_CONNECTIONS_PER_ADDRESS connections
    at once; the next is answered 429 with Retry-After and closed before anything is read, and a
    slot frees when a connection closes."""
    with nobackfill_serve(
        tmp_path / "data", KEY, max_connections_per_address="4", header_timeout_s="30"
    ) as (url, port):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        try:
            with socket.create_connection(("127.0.0.1", port)) as extra:
                answer = _read_all(extra, 3.0)
            assert answer.startswith(b"HTTP/1.1 429"), answer[:80]
            assert b"MAX_CONNECTIONS_PER_ADDRESS" in answer and b"retry-after: 1" in answer
            idle.pop().close()
            time.sleep(0.3)
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        finally:
            for sock in idle:
                sock.close()
        # Every slot free again: a client pool of 4 keeps working.
        with httpx.Client(base_url=url, limits=httpx.Limits(max_connections=4)) as client:
            assert all(client.get("/healthz").status_code == 200 for _ in range(20))
