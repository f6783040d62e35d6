"""Slow and stalled clients cannot hold the server: request bodies have read deadlines, and the
requests with a body in progress at once are capped per API key and in total.

A request body arrives at the client's pace. While it trickles in, the request holds a socket and
a task — and, before this guard and the handlers' order, it held a pooled database connection
inside an open transaction: 20 clients sending 14 of 100,000 promised bytes then nothing stopped
every tenant for 30 s (issue 24). Now:

- **deadlines**: each chunk of a body must arrive within ``body_idle_timeout_s`` of the previous
  one and the whole body within ``body_timeout_s``; past either, 408 problem+json and the
  connection is closed (what was sent is discarded: nothing is written from a partial body);
- **identify before reading** (issue 45, item 2): the API key is checked — and failures counted
  by the failed-auth throttle — when the headers arrive, before a byte of the body is read: a
  missing, unknown or revoked key answers 401 (429 while throttled) at once, so neither junk
  keys nor unauthenticated clients ever hold an upload slot, and a 60 MB body sent without a
  key is never parsed;
- **caps**: at most ``max_concurrent_uploads`` requests with a body are in progress at once, and
  at most ``max_concurrent_uploads_per_key`` per API key (its identity, not the header's
  spelling: one key sent with "Bearer" in 64 letter cases is one key); past either, 429 with
  ``Retry-After`` before any of the body is read. A request counts from its first byte
  until its answer is sent (so the parsed bodies held in memory are bounded too), not until its
  handler returns: teardown after the response would otherwise count against a client that
  already has its answer.

Once a body is complete, later ``receive`` calls (a streaming response waiting for the client to
go) pass through untouched.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import Problem, database_outage, log_outage, send_problem

BODY_METHODS = {"POST", "PUT", "PATCH"}
log = logging.getLogger(__name__)


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


def _client_address(scope: Scope) -> str:
    # The connection's peer, as uvicorn set it (from X-Forwarded-For only for trusted proxies).
    client = scope.get("client") or ("unknown", 0)
    return str(client[0])


def _presented_key(scope: Scope) -> str | None:
    """The bearer token of the ``Authorization`` header, parsed as the route's ``HTTPBearer``
    parses it (the scheme in any letter case), or None."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token if scheme.lower() == "bearer" and token else None
    return None


async def identify(scope: Scope) -> str:
    """Who the caps count against — the valid key's identity — or a ``Problem`` raised (401, or 429 while
    the address or key prefix is throttled), from the headers alone. Without the service's
    state (the app used without its lifespan), or when the lookup fails for a reason other than
    the database not answering (then a 503 ``Problem``), the client's address: the route then
    answers as it would."""
    from app.api.deps import authenticate, count_auth_failure
    from app.auth.service import tenant_for_key

    app = scope.get("app")
    state = getattr(getattr(app, "state", None), "service", None)
    address = _client_address(scope)
    if state is None:
        return f"addr:{address}"

    def lookup(key: str) -> str | None:
        with state.db.sessions() as session:
            return tenant_for_key(session, key)

    presented = _presented_key(scope)
    try:
        await run_in_threadpool(
            authenticate,
            state,
            address,
            presented,
            lookup,
            lambda reason: count_auth_failure(app, reason),
        )
    except Problem:
        raise
    except Exception as exc:
        # The database does not answer (wedged, restarting, out of connections): the route
        # could not check the key either. Its 503 at once, before the body: counted against the
        # client's address instead, every tenant behind one address (a proxy, a NAT) shared one
        # key's upload cap and got 429 for the others' requests (issue 45, the soak bench).
        outage = database_outage(exc)
        if outage is not None:
            log_outage(
                "body guard: the key could not be checked, the database does not answer: %s", exc
            )
            raise outage from None
        log.warning("body guard: the key could not be checked now; the route will", exc_info=True)
        return f"addr:{address}"
    # A valid key (authenticate raised otherwise): counted by the key itself, hashed, however
    # its header was spelled.
    return "key:" + hashlib.sha256((presented or "").encode()).hexdigest()


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
        try:
            key = await identify(scope)
        except Problem as problem:
            await send_problem(send, problem)
            return
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
