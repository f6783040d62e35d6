"""Slow and stalled clients cannot hold the server: request bodies have read deadlines, and the
requests with a body in progress at once are capped per API key and in total.

A request body arrives at the client's pace. While it trickles in, the request holds a socket and
a task — and, before this guard and the handlers' order, it held a pooled database connection
inside an open transaction: 20 clients sending 14 of 100,000 promised bytes then nothing stopped
every tenant for 30 s (issue 24). Now:

- **deadlines**: each chunk of a body must arrive within ``body_idle_timeout_s`` of the previous
  one and the whole body within ``body_timeout_s``; past either, 408 problem+json and the
  connection is closed (what was sent is discarded: nothing is written from a partial body);
- **caps**: at most ``max_concurrent_uploads`` requests with a body are in progress at once, and
  at most ``max_concurrent_uploads_per_key`` per API key (the ``Authorization`` header as sent,
  or the client's address without one: the key is checked later, by the route); past either,
  429 with ``Retry-After`` before any of the body is read. A request counts from its first byte
  until its answer is sent (so the parsed bodies held in memory are bounded too), not until its
  handler returns: teardown after the response would otherwise count against a client that
  already has its answer.

Once a body is complete, later ``receive`` calls (a streaming response waiting for the client to
go) pass through untouched.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import Problem, send_problem

BODY_METHODS = {"POST", "PUT", "PATCH"}


class BodyTimeout(HTTPException):
    def __init__(self, detail: str) -> None:
        super().__init__(408, detail, headers={"Connection": "close"})


def _has_body(scope: Scope) -> bool:
    if scope.get("method") not in BODY_METHODS:
        return False
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
        if name == b"transfer-encoding":
            return True
    return False


def _client_key(scope: Scope) -> str:
    """Who the cap counts against: the API key as sent (hashed: never kept in clear), or the
    client's address for requests without one."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            return "key:" + hashlib.sha256(value).hexdigest()
    client = scope.get("client") or ("unknown", 0)
    return f"addr:{client[0]}"


class BodyGuardMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        idle_timeout_s: float,
        total_timeout_s: float,
        max_uploads: int,
        max_uploads_per_key: int,
    ) -> None:
        self.app = app
        self.idle_timeout_s = idle_timeout_s
        self.total_timeout_s = total_timeout_s
        self.max_uploads = max_uploads
        self.max_uploads_per_key = max_uploads_per_key
        self.active = 0
        self.per_key: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        key = _client_key(scope)
        # One event loop: the check and the increments below cannot interleave with another's.
        if self.active >= self.max_uploads:
            await _refuse(
                send,
                "the server is receiving as many uploads as it accepts at once "
                f"({self.max_uploads}, NOBACKFILL_MAX_CONCURRENT_UPLOADS); retry shortly",
            )
            return
        if self.per_key[key] >= self.max_uploads_per_key:
            await _refuse(
                send,
                "this API key is already sending "
                f"{self.max_uploads_per_key} request bodies at once "
                "(NOBACKFILL_MAX_CONCURRENT_UPLOADS_PER_KEY); retry shortly",
            )
            return
        self.active += 1
        self.per_key[key] += 1
        started = time.monotonic()
        complete = False
        holding = True

        def release() -> None:
            # Once per request: when its answer is complete, or when it ends without one.
            nonlocal holding
            if not holding:
                return
            holding = False
            self.active -= 1
            self.per_key[key] -= 1
            if self.per_key[key] <= 0:
                del self.per_key[key]

        async def guarded_receive() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            left = self.total_timeout_s - (time.monotonic() - started)
            wait = min(self.idle_timeout_s, left)
            try:
                message = await asyncio.wait_for(receive(), timeout=max(wait, 0.0))
            except TimeoutError:
                idle = wait < left
                raise BodyTimeout(
                    f"the request body stalled: no data for {self.idle_timeout_s:g} s "
                    "(NOBACKFILL_BODY_IDLE_TIMEOUT_S)"
                    if idle
                    else f"the request body took longer than {self.total_timeout_s:g} s "
                    "(NOBACKFILL_BODY_TIMEOUT_S)"
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        async def releasing_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                # Freed before the client can see the answer: a client that waits for each
                # answer never finds its own finished request still counted (the handler's
                # teardown may run for a while after the response went out).
                release()
            await send(message)

        try:
            await self.app(scope, guarded_receive, releasing_send)
        finally:
            release()


async def _refuse(send: Send, detail: str) -> None:
    problem = Problem(
        429, "Too many requests", detail, slug="too-many-uploads", headers={"Retry-After": "1"}
    )
    await send_problem(send, problem)
