"""What the client raises: ``ApiError`` for an answer the server gave, ``UploadInterrupted``
for a batched upload cut short (rerunning it resumes)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(eq=False)
class ApiError(Exception):
    """A 4xx/5xx answer. ``errors`` are the RFC 9457 field errors (``{"field", "message"}``)."""

    status: int
    title: str
    detail: str
    errors: list[dict[str, str]] = field(default_factory=list)
    type: str = "about:blank"
    instance: str | None = None
    body: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.title} ({self.status}): {self.detail}"
        shown = [e for e in self.errors if e.get("field") and e["field"] not in self.detail]
        for error in shown:
            text += f"\n  {error['field']}: {error.get('message', '')}"
        return text

    @property
    def field_errors(self) -> dict[str, str]:
        return {e.get("field", ""): e.get("message", "") for e in self.errors}

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        """The problem+json body when there is one; otherwise the status and the text (a proxy's
        HTML page, say), cut short."""
        try:
            body = response.json()
        except (ValueError, UnicodeDecodeError):
            body = None
        if isinstance(body, dict) and "title" in body:
            errors = body.get("errors")
            return cls(
                status=int(body.get("status") or response.status_code),
                title=str(body["title"]),
                detail=str(body.get("detail", "")),
                errors=[e for e in errors if isinstance(e, dict)]
                if isinstance(errors, list)
                else [],
                type=str(body.get("type", "about:blank")),
                instance=body.get("instance"),
                body=body,
            )
        text = response.text.strip()
        if isinstance(body, dict | list):
            text = json.dumps(body)
        return cls(
            status=response.status_code,
            title=response.reason_phrase or "HTTP error",
            detail=text[:500] or f"{response.request.method} {response.request.url.path}",
        )


class UploadInterrupted(Exception):
    """A batched upload stopped before its end. The batches acknowledged so far are stored (and
    recorded in the checkpoint, when there is one): rerunning the same upload sends the rest."""

    def __init__(self, rows_done: int, rows_total: int, cause: BaseException) -> None:
        self.rows_done = rows_done
        self.rows_total = rows_total
        self.cause = cause
        super().__init__(
            f"upload interrupted after {rows_done} of {rows_total} rows ({cause}); "
            "rerun the same upload to send the rest"
        )
