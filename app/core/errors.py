"""RFC 9457 problem details: one exception type for the service, handlers for the rest."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.storage import is_no_space

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger(__name__)


@dataclass
class FieldError:
    """One bad input: ``field`` is a JSON path into the request (``vectors[3][17]``)."""

    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


class Problem(Exception):
    """An error the client can act on; rendered as application/problem+json."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        slug: str | None = None,
        errors: list[FieldError] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.slug = slug or title.lower().replace(" ", "-")
        self.errors = errors or []
        self.headers = headers or {}

    def body(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": f"urn:nobackfill:problem:{self.slug}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        if self.errors:
            body["errors"] = [e.as_dict() for e in self.errors]
        return body


def invalid(field: str, message: str, *, status: int = 422) -> Problem:
    """A single bad field (most validation failures)."""
    return Problem(
        status, "Invalid request", f"{field}: {message}", errors=[FieldError(field, message)]
    )


def invalid_fields(errors: list[FieldError], *, status: int = 422) -> Problem:
    detail = "; ".join(f"{e.field}: {e.message}" for e in errors[:5])
    if len(errors) > 5:
        detail += f"; and {len(errors) - 5} more"
    return Problem(status, "Invalid request", detail, errors=errors)


def not_found(kind: str, resource_id: str) -> Problem:
    return Problem(404, "Not found", f"{kind} {resource_id!r} does not exist")


def conflict(detail: str) -> Problem:
    return Problem(409, "Conflict", detail)


def problem_response(problem: Problem, request: Request | None = None) -> JSONResponse:
    instance = request.url.path if request is not None else None
    return JSONResponse(
        problem.body(instance),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=problem.headers,
    )


async def send_problem(send: Any, problem: Problem, close: bool = True) -> None:
    """Answer with ``problem`` straight from an ASGI middleware (before any route runs)."""
    body = json.dumps(problem.body()).encode()
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), str(v).encode()) for k, v in (problem.headers or {}).items()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": problem.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _loc_to_field(loc: tuple[Any, ...]) -> str:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    field = ""
    for part in parts:
        if isinstance(part, int):
            field += f"[{part}]"
        else:
            field += f".{part}" if field else str(part)
    return field or "body"


def validation_problem(raw_errors: list[dict[str, Any]]) -> Problem:
    """Pydantic errors → one 422 naming each field (at most 50: a 10,000-row upload must not
    echo every bad element)."""
    errors = []
    for err in raw_errors[:50]:
        if err.get("type") == "json_invalid":
            errors.append(FieldError("body", f"malformed JSON: {err.get('msg', '')}"))
        else:
            field = _loc_to_field(tuple(err.get("loc", ())))
            errors.append(FieldError(field, str(err.get("msg", "invalid"))))
    return invalid_fields(errors or [FieldError("body", "invalid request")])


# While the database is unreachable every request fails the same way: one log line per interval
# (with how many were not logged) instead of one per request.
OUTAGE_LOG_INTERVAL_S = 10.0
_outage_lock = threading.Lock()
_outage_state = {"last": 0.0, "suppressed": 0}


def log_outage(message: str, *args: Any) -> None:
    now = time.monotonic()
    with _outage_lock:
        if now - _outage_state["last"] < OUTAGE_LOG_INTERVAL_S:
            _outage_state["suppressed"] += 1
            return
        suppressed, _outage_state["suppressed"] = _outage_state["suppressed"], 0
        _outage_state["last"] = now
    log.warning(message + " (%d similar not logged)", *args, suppressed)


def unavailable(detail: str, retry_after_s: int) -> Problem:
    return Problem(503, "Service unavailable", detail, headers={"Retry-After": str(retry_after_s)})


def database_outage(exc: BaseException) -> Problem | None:
    """The 503 a request answers when ``exc`` says the database cannot serve it now (every
    pooled connection busy, or the server unreachable, wedged or restarting), as the handlers
    below answer it; None for any other error. For code that meets such an error outside a
    request's handlers (the body guard, the job runner)."""
    if isinstance(exc, PoolTimeout):
        return unavailable("every database connection is busy; retry shortly", 1)
    if (
        isinstance(exc, DBAPIError)
        and not isinstance(exc, IntegrityError)
        and not is_no_space(exc)
        and _is_unavailable(exc)
    ):
        return unavailable("the database is unreachable or busy; retry shortly", 5)
    return None


def log_background_failure(logger: logging.Logger, message: str, exc: BaseException) -> None:
    """A background loop's failed round (the job sweep, a job slot, the returned tally's flush):
    a database outage as one rate-limited warning (``log_outage``: the loop retries, and while
    the database restarts every round fails the same way), anything else with its traceback."""
    if database_outage(exc) is not None:
        log_outage(f"{message}: database unavailable (%s)", type(exc).__name__)
    else:
        logger.error(message, exc_info=exc)


def insufficient_storage(where: str) -> Problem:
    """507: the disk (or a quota, or a file-size limit) is full; nothing was stored."""
    return Problem(
        507,
        "Insufficient storage",
        f"the server's storage is full ({where}); nothing was stored: retry once space is freed",
    )


def _no_space_response(request: Request, exc: BaseException) -> JSONResponse:
    """A write that found the disk full: 507, and the service's storage state marked full (for
    /readyz) when the app keeps one."""
    where = "database" if isinstance(exc, DBAPIError) else "data directory"
    health = getattr(getattr(request.app.state, "service", None), "storage", None)
    if health is not None:
        health.mark_full(f"{request.method} {request.url.path}", exc)
    log_outage("storage full on %s %s: %s", request.method, request.url.path, exc)
    return problem_response(insufficient_storage(where), request)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_response(validation_problem(list(exc.errors())), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        titles = {
            401: "Unauthorized",
            404: "Not found",
            405: "Method not allowed",
            408: "Request timeout",
            413: "Request too large",
        }
        problem = Problem(
            exc.status_code,
            titles.get(exc.status_code, "HTTP error"),
            str(exc.detail),
            headers=dict(exc.headers or {}),
        )
        return problem_response(problem, request)

    @app.exception_handler(IntegrityError)
    async def _integrity(request: Request, exc: IntegrityError) -> JSONResponse:
        # Two concurrent requests raced for the same unique name, id or Idempotency-Key.
        log.info("integrity error on %s %s: %s", request.method, request.url.path, exc.orig)
        problem = conflict("the request conflicts with a concurrent change; retry it")
        return problem_response(problem, request)

    @app.exception_handler(PoolTimeout)
    async def _pool_timeout(request: Request, exc: PoolTimeout) -> JSONResponse:
        # Every pooled connection is busy: the request is refused, not queued without end.
        log_outage("no database connection free for %s %s", request.method, request.url.path)
        problem = unavailable("every database connection is busy; retry shortly", 1)
        return problem_response(problem, request)

    @app.exception_handler(DBAPIError)
    async def _database(request: Request, exc: DBAPIError) -> JSONResponse:
        # IntegrityError is a DBAPIError too, but has its own (more specific) handler above.
        if is_no_space(exc):  # SQLite's SQLITE_FULL, PostgreSQL's disk_full
            return _no_space_response(request, exc)
        if not _is_unavailable(exc):
            return await _unexpected(request, exc)
        log_outage("database unavailable on %s %s: %s", request.method, request.url.path, exc.orig)
        problem = unavailable("the database is unreachable or busy; retry shortly", 5)
        return problem_response(problem, request)

    @app.exception_handler(OSError)
    async def _os_error(request: Request, exc: OSError) -> JSONResponse:
        if is_no_space(exc):  # ENOSPC, EDQUOT, EFBIG: a segment, an upload's temp file, …
            return _no_space_response(request, exc)
        return await _unexpected(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        if is_no_space(exc):  # wrapped by a library (a cause or context of ``exc``)
            return _no_space_response(request, exc)
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        problem = Problem(500, "Internal error", "the server failed; the error was logged")
        return problem_response(problem, request)


def _is_unavailable(exc: DBAPIError) -> bool:
    """A lost or refused connection, a server shutting down, a cancelled statement or a busy
    SQLite file: the request may succeed later. Anything else is a bug (500)."""
    if exc.connection_invalidated:
        return True
    text = str(exc.orig).lower()
    signs = (
        "connection",
        "server closed",
        "terminating",
        "timeout",
        "canceling statement",
        "database is locked",
        "could not connect",
        "the database system is",
    )
    return any(sign in text for sign in signs)
