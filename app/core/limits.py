"""Request-size limit, enforced before a body is parsed (Content-Length) and while it streams;
and the limits an array of a request is held to before it is parsed (``ArrayLimits``)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import Problem, send_problem
from app.core.settings import Settings


@dataclass(frozen=True)
class ArrayLimits:
    """What one array of a request may claim: a ``.npy`` header is checked against these before
    numpy allocates anything or a list of its rows is built. Its bytes are bounded by the body
    limit (``BodyLimitMiddleware`` below): a header must promise exactly the bytes that follow."""

    max_rows: int
    max_dim: int

    @classmethod
    def of(cls, settings: Settings) -> ArrayLimits:
        return cls(
            max_rows=settings.max_vectors_per_request,
            max_dim=settings.max_dim,
        )


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` mid-stream; an HTTPException so FastAPI's body parsing re-raises
    it instead of turning it into a generic 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the limit of {limit} bytes")


def too_large(limit: int) -> Problem:
    return Problem(
        413,
        "Request too large",
        f"request body exceeds the limit of {limit} bytes (NOBACKFILL_MAX_REQUEST_BYTES); "
        "split the upload",
        slug="request-too-large",
    )


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send: Send) -> None:
        await send_problem(send, too_large(self.max_bytes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    await self._reject(send)
                    return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)
