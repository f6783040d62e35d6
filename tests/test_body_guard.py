"""BodyGuardMiddleware's caps count a request with a body from its first byte until its answer
is sent, not until its handler returns: a client that already has its answer (the handler's
teardown still pending) is not refused. Before the fix a slot was held until the handler
returned, so 4 searching clients and 1 uploader saw "already sending 8 request bodies at once"
when teardowns lingered on a busy machine (bench.perf.load's failure in CI, 1 search in 133).
"""

from __future__ import annotations

import asyncio
import json

from starlette.types import Message, Receive, Scope, Send

from app.api.body_guard import BodyGuardMiddleware

KEY = b"Bearer nbk_test"


def _scope() -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/x",
        "headers": [(b"authorization", KEY), (b"content-length", b"2")],
        "client": ("127.0.0.1", 1234),
    }


class Handler:
    """Reads the whole body, waits for ``answer``, answers 200, then waits for ``teardown``
    (what runs after the response went out: a dependency's cleanup, a background task)."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.teardown = asyncio.Event()
        self.bodies_read = 0
        self.answered = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        while message.get("more_body", False):
            message = await receive()
        self.bodies_read += 1
        await self.answer.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
        self.answered += 1
        await self.teardown.wait()


class Client:
    """One request: a body that arrives in two chunks (the second only when ``finish`` is set)."""

    def __init__(self, finish: bool = True) -> None:
        self.finish = asyncio.Event()
        if finish:
            self.finish.set()
        self.sent: list[Message] = []
        self.chunks = 0

    async def receive(self) -> Message:
        self.chunks += 1
        if self.chunks == 1:
            return {"type": "http.request", "body": b"{", "more_body": True}
        if self.chunks == 2:
            await self.finish.wait()
            return {"type": "http.request", "body": b"}", "more_body": False}
        await asyncio.Event().wait()  # a disconnect that never comes
        raise AssertionError

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        return starts[0]["status"] if starts else None


def _guard(handler: Handler, per_key: int) -> BodyGuardMiddleware:
    return BodyGuardMiddleware(
        handler,
        idle_timeout_s=5,
        total_timeout_s=10,
        max_uploads=100,
        max_uploads_per_key=per_key,
    )


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0)


def test_an_answered_request_in_teardown_holds_no_slot() -> None:
    async def scenario() -> None:
        handler = Handler()
        guard = _guard(handler, per_key=1)
        first, second = Client(), Client()
        handler.answer.set()
        running = asyncio.create_task(guard(_scope(), first.receive, first.send))
        await _until(lambda: handler.answered == 1)
        assert first.status == 200 and not running.done()
        # The first request has its answer, its teardown still runs: the key may send another.
        follow = asyncio.create_task(guard(_scope(), second.receive, second.send))
        await _until(lambda: handler.answered == 2 or follow.done())
        assert second.status == 200, second.sent
        handler.teardown.set()
        await asyncio.gather(running, follow)
        assert guard.active == 0 and not guard.per_key

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_body_arriving_or_being_answered_holds_its_slot() -> None:
    async def scenario() -> None:
        handler = Handler()
        handler.teardown.set()
        guard = _guard(handler, per_key=1)
        stalled, refused, processing_refused, later = Client(False), Client(), Client(), Client()
        running = asyncio.create_task(guard(_scope(), stalled.receive, stalled.send))
        await _until(lambda: stalled.chunks == 2)
        # A second body while the first still arrives: refused before any of it is read.
        await guard(_scope(), refused.receive, refused.send)
        assert refused.status == 429 and refused.chunks == 0
        body = json.loads(refused.sent[1]["body"])
        assert "NOBACKFILL_MAX_CONCURRENT_UPLOADS_PER_KEY" in body["detail"]
        # The body is complete, the answer not yet sent: its parsed body is still held, so the
        # slot is too (memory stays bounded by the cap).
        stalled.finish.set()
        await _until(lambda: handler.bodies_read == 1)
        await guard(_scope(), processing_refused.receive, processing_refused.send)
        assert processing_refused.status == 429
        handler.answer.set()
        await running
        await guard(_scope(), later.receive, later.send)
        assert (stalled.status, later.status) == (200, 200)
        assert guard.active == 0 and not guard.per_key

    asyncio.run(asyncio.wait_for(scenario(), 10))
