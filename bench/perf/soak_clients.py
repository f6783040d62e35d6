"""The hostile clients of ``bench.perf.soak``: raw-socket bodies that stall, trickle or claim
more than the limit, and requests whose content the API must refuse (lying ``.npy`` headers,
deep JSON, NaN, wrong dimensions, unknown keys). Every loop is bounded in count and in time, and
every connection goes to the loopback server the soak started.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from numpy.lib import format as npy_format

from bench.common.service import npy_bytes
from bench.perf.soak_checks import CLOSED, HOSTILE_EXPECTED, STREAM_503, Tally

OCTET = "application/octet-stream"
NPY = "application/x-npy"
CLAIMED_ROWS = 30_000_000
MAX_LOOPS = 100_000  # a ceiling on every loop, beside its deadline


def npy_claiming(shape: tuple[int, ...], payload: bytes, descr: str = "<f4") -> bytes:
    """A well-formed ``.npy`` header promising ``shape``, followed by ``payload``."""
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + payload


@dataclass
class Target:
    """Where hostile requests go: the server, a gallery, and the key to send."""

    host: str
    port: int
    gallery: str
    key: str
    dim: int
    local_address: str | None = None  # the loopback address to connect from


@dataclass
class Answer:
    """What a raw exchange got: the status (None: no answer), the body (or why none came), and
    whether the answer carried Retry-After."""

    status: int | None
    text: str
    retry_after: bool = False


async def read_status(reader: asyncio.StreamReader) -> Answer:
    """The status, body and Retry-After of one HTTP/1.1 response (Content-Length framed, as the
    API's are)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length, retry_after = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        retry_after |= name.strip().lower() == "retry-after"
    body = await reader.readexactly(length) if length else b""
    return Answer(status, body.decode("utf-8", "replace"), retry_after)


async def raw_exchange(
    target: Target,
    head: str,
    feed: Callable[[asyncio.StreamWriter], Awaitable[None]],
    timeout: float,
) -> Answer:
    """Send ``head``, then let ``feed`` write (or withhold) the body while waiting up to
    ``timeout`` s for the answer (``Answer(None, why)`` when none came)."""
    try:
        local = (target.local_address, 0) if target.local_address else None
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(target.host, target.port, local_addr=local), timeout
        )
    except (OSError, TimeoutError) as exc:
        return Answer(None, f"connect: {exc!r}")
    feeder = None
    try:
        writer.write(head.encode("latin-1"))
        await writer.drain()
        feeder = asyncio.create_task(feed(writer))
        return await asyncio.wait_for(read_status(reader), timeout)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        return Answer(None, repr(exc))
    finally:
        if feeder is not None:
            feeder.cancel()
            with contextlib.suppress(BaseException):
                await feeder
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _head(target: Target, path: str, key: str, length: int | None, content_type: str) -> str:
    framing = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        f"POST {path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: {content_type}\r\n{framing}\r\n\r\n"
    )


async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(OSError):
        writer.write(data)
        await writer.drain()


def _add(tally: Tally, got: Answer, sent: float, expected: set[int]) -> None:
    tally.add(
        got.status,
        time.monotonic() - sent,
        expected,
        got.text,
        sent=sent,
        retry_after=got.retry_after,
    )


def _paths(target: Target, n: int) -> str:
    return f"/v1/galleries/{target.gallery}/" + ("vectors" if n % 2 else "search")


async def stalled_bodies(
    target: Target, tally: Tally, until: float, answer_timeout: float, stop_after: int
) -> None:
    """Promise 100,000 bytes, send 14, then nothing: the server must answer 408 after
    BODY_IDLE_TIMEOUT_S (or 429 when this key already sends as many bodies as it may)."""

    async def feed(writer: asyncio.StreamWriter) -> None:
        await _write(writer, b'{"ids": ["a"],')
        await asyncio.sleep(3600)

    for n in range(min(stop_after, MAX_LOOPS)):
        if time.monotonic() >= until:
            return
        head = _head(target, _paths(target, n), target.key, 100_000, "application/json")
        tic = time.monotonic()
        got = await raw_exchange(target, head, feed, answer_timeout)
        _add(tally, got, tic, HOSTILE_EXPECTED["stalled_body"])
        if got.status == 429:
            await asyncio.sleep(0.5)


async def trickled_bodies(
    target: Target,
    tally: Tally,
    until: float,
    interval: float,
    body_timeout: float,
    answer_timeout: float,
) -> None:
    """Slowloris: one byte every ``interval`` s (under the idle deadline), so only the whole
    body's deadline (``body_timeout``, BODY_TIMEOUT_S) ends it: 408. The trickle stops a second
    before that deadline: a byte landing on the connection the server has just closed would
    make it answer with a reset, which may discard the 408 on its way."""

    async def feed(writer: asyncio.StreamWriter) -> None:
        for _ in range(int((body_timeout - 1.0) / interval)):
            await _write(writer, b" ")
            await asyncio.sleep(interval)
        await asyncio.sleep(3600)

    for n in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        head = _head(target, _paths(target, n), target.key, 100_000, "application/json")
        tic = time.monotonic()
        got = await raw_exchange(target, head, feed, answer_timeout)
        _add(tally, got, tic, HOSTILE_EXPECTED["trickle_body"])
        if got.status == 429:
            await asyncio.sleep(0.5)


async def oversized_bodies(
    target: Target,
    tallies: dict[str, Tally],
    max_bytes: int,
    until: float,
    pause: float,
    answer_timeout: float,
) -> None:
    """In turn: a Content-Length over MAX_REQUEST_BYTES and no body sent (413 from the header
    alone), and a chunked body that crosses the limit with its last chunk (413 while it
    streams; nothing is left unread, so the answer is not lost to a reset)."""

    async def claim(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)  # not a byte of it: the answer comes from the header

    async def stream(writer: asyncio.StreamWriter) -> None:
        chunk, sent = 64 * 1024, 0
        while sent < max_bytes:
            n = min(chunk, max_bytes - sent)
            await _write(writer, f"{n:x}\r\n".encode() + b"x" * n + b"\r\n")
            sent += n
        await _write(writer, b"400\r\n" + b"x" * 1024 + b"\r\n")
        await asyncio.sleep(3600)

    for n in range(MAX_LOOPS):
        kind, length, feed = (
            ("claimed_length", max_bytes + 1, claim)
            if n % 2 == 0
            else ("streamed_over_limit", None, stream)
        )
        if time.monotonic() >= until:
            return
        head = _head(target, _paths(target, n // 2), target.key, length, "application/json")
        tic = time.monotonic()
        got = await raw_exchange(target, head, feed, answer_timeout)
        _add(tallies[kind], got, tic, HOSTILE_EXPECTED[kind])
        await asyncio.sleep(pause)


def content_requests(target: Target, n: int) -> list[tuple[str, dict[str, Any]]]:
    """(kind, httpx request arguments) of every content the API must refuse; ids start with
    ``evil-``, so a stored one would show in the gallery's count."""
    gallery = f"/v1/galleries/{target.gallery}"
    ids = [f"evil-{n}-{i}" for i in range(2)]
    ok_rows = np.ones((2, target.dim), dtype=np.float32)
    nan_rows = ok_rows.copy()
    nan_rows[1, n % target.dim] = np.nan if n % 2 else np.inf
    ids_part = ("ids.npy", npy_bytes(np.array(ids)), OCTET)
    deep = "[" * 100_000 + "]" * 100_000
    json_row = ",".join(["0.5"] * (target.dim - 1))
    return [
        (
            "npy_huge_rows",
            {
                "url": f"{gallery}/vectors",
                "files": {
                    "ids": ids_part,
                    "vectors": ("v.npy", npy_claiming((CLAIMED_ROWS, target.dim), b""), OCTET),
                },
            },
        ),
        (
            "npy_huge_strings",
            {
                "url": f"{gallery}/vectors",
                "files": {
                    "ids": (
                        "ids.npy",
                        npy_claiming((CLAIMED_ROWS,), b"ab" * 16, "<U1000000"),
                        OCTET,
                    ),
                    "vectors": ("v.npy", npy_bytes(ok_rows), OCTET),
                },
            },
        ),
        (
            "npy_search_huge",
            {
                "url": f"{gallery}/search",
                "content": npy_claiming((CLAIMED_ROWS, target.dim), b"\0" * 64),
                "headers": {"Content-Type": NPY},
            },
        ),
        (
            "json_deep",
            {
                "url": f"{gallery}/vectors",
                "content": '{"ids": ["evil"], "vectors": ' + deep + "}",
                "headers": {"Content-Type": "application/json"},
            },
        ),
        (
            "multipart_deep_metadata",
            {
                "url": f"{gallery}/vectors",
                "files": {
                    "ids": ids_part,
                    "vectors": ("v.npy", npy_bytes(ok_rows), OCTET),
                    "metadata": (None, '[{"a": ' + deep + "}, {}]", "application/json"),
                },
            },
        ),
        (
            "nan_json",
            {
                "url": f"{gallery}/vectors",
                "content": f'{{"ids": ["{ids[0]}"], "vectors": [[NaN,{json_row}]]}}',
                "headers": {"Content-Type": "application/json"},
            },
        ),
        (
            "nan_npy",
            {
                "url": f"{gallery}/vectors",
                "files": {"ids": ids_part, "vectors": ("v.npy", npy_bytes(nan_rows), OCTET)},
            },
        ),
        (
            "wrong_dim_upload",
            {
                "url": f"{gallery}/vectors",
                "json": {"ids": ids, "vectors": np.ones((2, target.dim + 1)).tolist()},
            },
        ),
        (
            "wrong_dim_search",
            {
                "url": f"{gallery}/search",
                "content": npy_bytes(np.ones((3, target.dim - 1), dtype=np.float32)),
                "headers": {"Content-Type": NPY},
            },
        ),
    ]


async def timed(
    client: httpx.AsyncClient, tally: Tally, expected: set[int], method: str, **kwargs: Any
) -> httpx.Response | None:
    """Send one request; record its status (or no answer), latency and Retry-After in
    ``tally``."""
    tic = time.monotonic()
    try:
        response = await client.request(method, **kwargs)
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}: {exc}"
        tally.add(None, time.monotonic() - tic, expected, why, sent=tic)
        return None
    tally.add(
        response.status_code,
        time.monotonic() - tic,
        expected,
        response.text,
        sent=tic,
        retry_after="retry-after" in response.headers,
    )
    return response


async def hostile_content(
    clients: list[tuple[httpx.AsyncClient, Target]],
    tallies: dict[str, Tally],
    until: float,
    pause: float,
) -> None:
    """Every refused content in turn, against each target in turn, until ``until``."""
    for n in range(MAX_LOOPS):
        client, target = clients[n % len(clients)]
        for kind, request in content_requests(target, n):
            if time.monotonic() >= until:
                return
            await timed(client, tallies[kind], HOSTILE_EXPECTED[kind], "POST", **request)
            await asyncio.sleep(pause)


async def wrong_keys(
    client: httpx.AsyncClient, gallery: str, tally: Tally, until: float, pause: float
) -> None:
    """Unknown keys (and none): 401, then 429 once the address has failed 20 times in 60 s.
    ``client`` sends from its own loopback address, so the throttle holds only it back."""
    expected = HOSTILE_EXPECTED["wrong_key"]
    for n in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        headers = {} if n % 5 == 0 else {"Authorization": f"Bearer nbk_guess_{n:032d}"}
        if n % 2:
            body = json.dumps({"vectors": [[0.5, 0.5]], "k": 1})
            await timed(
                client,
                tally,
                expected,
                "POST",
                url=f"/v1/galleries/{gallery}/search",
                content=body,
                headers={**headers, "Content-Type": "application/json"},
            )
        else:
            await timed(client, tally, expected, "GET", url="/v1/galleries", headers=headers)
        await asyncio.sleep(pause)


def big_search_body(rows: int, dim: int, k: int) -> str:
    """A JSON search of ``rows`` queries (every value 0.5: short, so that 1,000 × 384 stays
    under MAX_REQUEST_BYTES) and ``k``."""
    row = "[" + ",".join(["0.5"] * dim) + "]"
    return '{"vectors": [' + ",".join([row] * rows) + f'], "k": {k}}}'


async def big_searches(
    client: httpx.AsyncClient, url: str, body: str, tally: Tally, until: float, pause: float
) -> None:
    """JSON searches whose queries × k exceed MAX_HITS_PER_REQUEST: 422 before any search."""
    for _ in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        headers = {"Content-Type": "application/json"}
        await timed(
            client,
            tally,
            HOSTILE_EXPECTED["big_search"],
            "POST",
            url=url,
            content=body,
            headers=headers,
        )
        await asyncio.sleep(pause)


async def streamed_search(
    client: httpx.AsyncClient, url: str, body: str, n_queries: int, tally: Tally
) -> None:
    """One search asked for as NDJSON, read to its end: 200 counts only with a last line
    ``{"done": true, "queries": n}`` for all ``n_queries`` queries, each line numbered in turn."""
    expected = HOSTILE_EXPECTED["big_search_streamed"]
    headers = {"Content-Type": "application/json", "Accept": "application/x-ndjson"}
    tic = time.monotonic()

    def add(status: int | str | None, text: str, retry_after: bool = False) -> None:
        tally.add(status, time.monotonic() - tic, expected, text, sent=tic, retry_after=retry_after)

    try:
        async with client.stream("POST", url, content=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                add(response.status_code, text, "retry-after" in response.headers)
                return
            last, seen = None, 0
            async for line in response.aiter_lines():
                if not line:
                    continue
                last = json.loads(line)
                if "query" in last:
                    if last["query"] != seen:
                        raise ValueError(f"line {seen} numbered {last['query']}")
                    seen += 1
    except (httpx.HTTPError, ValueError) as exc:
        add(None, f"{type(exc).__name__}: {exc}")
        return
    done = isinstance(last, dict) and last.get("done") is True and last.get("queries") == seen
    error = last.get("error") if isinstance(last, dict) else None
    if done and seen == n_queries:
        add(200, f"{time.monotonic():.2f}")
    elif (
        isinstance(error, dict) and error.get("status") == 503 and error.get("queries_sent") == seen
    ):
        # Cut short by a wedged database after its 200 went out: its last line says so.
        add(STREAM_503, f"after {seen} of {n_queries} queries: {error.get('detail')}")
    else:
        add(None, f"stream ended after {seen} of {n_queries} queries; last line {str(last)[:200]}")


async def streamed_searches(
    client: httpx.AsyncClient,
    url: str,
    body: str,
    n_queries: int,
    tally: Tally,
    until: float,
    first_after: float,
    interval: float,
) -> None:
    """A few streamed big searches, one at a time: the first ``first_after`` s in, then one
    every ``interval`` s (from one's start to the next's) while the run lasts."""
    await asyncio.sleep(max(0.0, min(first_after, until - time.monotonic())))
    for _ in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        start = time.monotonic()
        await streamed_search(client, url, body, n_queries, tally)
        await asyncio.sleep(max(0.0, start + interval - time.monotonic()))


async def junk_key_bodies(
    target: Target,
    tally: Tally,
    claimed: int,
    sent: int,
    until: float,
    pause: float,
    answer_timeout: float,
) -> None:
    """A body promising ``claimed`` bytes under a junk key, of which only ``sent`` are sent (less
    than uvicorn buffers before pausing its reads, so no unread byte turns the close into a
    reset): the key is refused from the headers, 401 (429 once the address is throttled), with
    the rest of the body never sent."""
    rng = np.random.default_rng(45)

    async def feed(writer: asyncio.StreamWriter) -> None:
        await _write(writer, b"x" * sent)
        await asyncio.sleep(3600)

    for n in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        key = "nbk_" + rng.bytes(24).hex()
        head = _head(target, _paths(target, n), key, claimed, "application/json")
        tic = time.monotonic()
        got = await raw_exchange(target, head, feed, answer_timeout)
        _add(tally, got, tic, HOSTILE_EXPECTED["junk_key_body"])
        await asyncio.sleep(pause)


async def header_slowlorises(
    target: Target,
    tally: Tally,
    until: float,
    interval: float,
    header_timeout: float,
    answer_timeout: float,
) -> None:
    """A request line, then header bytes one every ``interval`` s, never the blank line: the
    server must answer 408 after HEADER_TIMEOUT_S (or 431, or close the connection). The
    trickle stops a second before that deadline, as ``trickled_bodies``' does."""

    async def feed(writer: asyncio.StreamWriter) -> None:
        await _write(writer, b"X-Slow: ")
        for _ in range(int((header_timeout - 1.0) / interval)):
            await _write(writer, b"z")
            await asyncio.sleep(interval)
        await asyncio.sleep(3600)

    head = f"GET /healthz HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
    for _ in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        tic = time.monotonic()
        got = await raw_exchange(target, head, feed, answer_timeout)
        closed = got.status is None and (
            "IncompleteReadError" in got.text or "ConnectionReset" in got.text
        )
        tally.add(
            CLOSED if closed else got.status,
            time.monotonic() - tic,
            HOSTILE_EXPECTED["header_slowloris"],
            got.text,
            sent=tic,
            retry_after=got.retry_after,
        )


async def job_flood(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    jobs: list[str],
    tally: Tally,
    until: float,
    retry_s: float,
) -> None:
    """A tenant that keeps the queue full of the longest upgrades the server accepts: 202
    until it holds as many jobs as it may, then 429, tried again every ``retry_s`` s (its
    Retry-After ignored, as a hostile client would). The ids of its jobs go to ``jobs``."""
    expected = HOSTILE_EXPECTED["job_flood"]
    for n in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        response = await timed(
            client, tally, expected, "POST", url="/v1/upgrades", json={**body, "seed": n}
        )
        if response is not None and response.status_code == 202:
            jobs.append(str(response.json()["id"]))
            continue
        await asyncio.sleep(retry_s)
