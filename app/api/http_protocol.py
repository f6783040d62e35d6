"""Bounds on what a connection may send before its request's headers are complete (issue 45,
item 3): uvicorn's httptools protocol had none. Two 100 MB header lines to ``/healthz`` (no key
needed) stalled the event loop 16–18 s and took ~160 MB each, and connections whose headers
never finished were never closed.

``bounded_protocol(max_header_bytes, header_timeout_s)`` is uvicorn's httptools protocol with:

* **a size bound** — while a request's headers are incomplete, the bytes received for them are
  counted; past ``max_header_bytes`` the answer is ``431`` and the connection closes;
* **a time bound** — a request's headers must be complete within ``header_timeout_s`` of the
  connection opening or of the previous response (a keep-alive connection's next request);
  otherwise ``408`` and the connection closes. The body is the body guard's (``BODY_*``).

* **a connection bound per client address** — at most ``max_connections_per_address``
  connections from one peer address at once; the next is answered ``429`` with ``Retry-After``
  and closed before anything is read (a slowloris from one address holds a bounded share of the
  server). The addresses of trusted proxies are exempt: behind one, every client shares it.

The answers are written on the transport directly (no application runs for them), as
problem+json, with ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _problem_bytes(status: int, reason: str, detail: str, extra: str = "") -> bytes:
    body = json.dumps(
        {
            "type": f"urn:nobackfill:problem:{reason.lower().replace(' ', '-')}",
            "title": reason,
            "status": status,
            "detail": detail,
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "content-type: application/problem+json\r\n"
        f"content-length: {len(body)}\r\n"
        f"{extra}connection: close\r\n\r\n"
    ).encode()
    return head + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    max_connections_per_address: int = 0  # 0: no bound
    exempt_addresses: frozenset[str] = frozenset()
    # Open connections per peer address, shared by every connection of one server (one event
    # loop: no lock needed); ``bounded_protocol`` gives each server class its own.
    open_by_address: ClassVar[Counter[str]] = Counter()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_bytes = 0
        self._awaiting_headers = True
        self._header_timer: asyncio.TimerHandle | None = None
        self._counted_address: str | None = None
        self._arm_header_timer()
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else None
        if (
            address is None
            or not self.max_connections_per_address
            or address in self.exempt_addresses
            or "*" in self.exempt_addresses
        ):
            return
        if self.open_by_address[address] >= self.max_connections_per_address:
            self._refuse(
                429,
                "Too Many Requests",
                f"this address already holds {self.max_connections_per_address} connections "
                "(MAX_CONNECTIONS_PER_ADDRESS); reuse one, or retry when one closes",
                "retry-after: 1\r\n",
            )
            return
        self.open_by_address[address] += 1
        self._counted_address = address

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _refuse(self, status: int, reason: str, detail: str, extra: str = "") -> None:
        self._cancel_header_timer()
        if not self.transport.is_closing():
            self.transport.write(_problem_bytes(status, reason, detail, extra))
            self.transport.close()

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self._awaiting_headers:
            self._refuse(
                408,
                "Request Timeout",
                f"the request's headers did not arrive within {self.header_timeout_s:g} s "
                "(HEADER_TIMEOUT_S)",
            )

    def data_received(self, data: bytes) -> None:
        waiting = self._awaiting_headers
        super().data_received(data)
        # Still waiting after the parser took this chunk: all of it was header bytes.
        if waiting and self._awaiting_headers and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"the request line and headers exceed {self.max_header_bytes} bytes "
                    "(MAX_HEADER_BYTES)",
                )

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._header_bytes = 0
        self._cancel_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # A pipelined request already parsed starts next: its headers are complete.
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            # The connection is kept alive: its next request's headers have the same bounds.
            self._awaiting_headers = True
            self._header_bytes = 0
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        address, self._counted_address = self._counted_address, None
        if address is not None:
            self.open_by_address[address] -= 1
            if self.open_by_address[address] <= 0:
                del self.open_by_address[address]
        super().connection_lost(exc)


def bounded_protocol(
    max_header_bytes: int,
    header_timeout_s: float,
    max_connections_per_address: int = 0,
    exempt_addresses: Iterable[str] = (),
) -> type[Any]:
    """The protocol class ``nobackfill serve`` gives uvicorn (``http=``)."""
    return type(
        "BoundedHttpToolsProtocol",
        (BoundedHttpToolsProtocol,),
        {
            "max_header_bytes": max_header_bytes,
            "header_timeout_s": header_timeout_s,
            "max_connections_per_address": max_connections_per_address,
            "exempt_addresses": frozenset(exempt_addresses),
            "open_by_address": Counter(),
        },
    )
