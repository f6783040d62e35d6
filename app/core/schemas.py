"""Pydantic pieces shared by the domain schemas."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any

from fastapi import Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat


def _check_name(value: str) -> str:
    if value != value.strip():
        raise ValueError("must not start or end with whitespace")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in value):
        raise ValueError("control and format characters are not allowed")
    if "/" in value or "\\" in value or value in (".", ".."):
        raise ValueError("slashes and '.'/'..' are not allowed")
    return value


def _check_printable(value: str) -> str:
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value):
        raise ValueError("control characters and lone surrogates are not allowed")
    return value


# Free text stored as given (PostgreSQL refuses NUL; control characters are a client bug).
Text = Annotated[str, AfterValidator(_check_printable)]
# A user-facing name: printable, no path separators (names never become file paths anyway).
Name = Annotated[str, Field(min_length=1, max_length=128), AfterValidator(_check_name)]
ModalityName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
# A modality in the query string, where a request's body is one `.npy` array.
NpyModalityQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="application/x-npy bodies only",
    ),
]
# DELETE's consent to drop the acknowledged data that depends on what is deleted (re-embedded
# items): without it such a delete answers 409 naming them.
CascadeQuery = Annotated[
    bool,
    Query(description="also delete the re-embedded items that depend on it (200: how many)"),
]
# Strict: JSON numbers only; true, null or "1" in a vector is a client bug, not a 1.0.
Matrix = list[list[StrictFloat]]
PageTokenQuery = Annotated[
    str | None, Query(max_length=128, description="next_page_token of the previous page")
]
LimitQuery = Annotated[int, Query(ge=1, description="page size (capped by max_page_size)")]


class StrictModel(BaseModel):
    """Request bodies refuse unknown fields: a typo is an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class Page(BaseModel):
    next_page_token: str | None = Field(
        default=None, description="pass as `page_token` for the next page; absent on the last"
    )


def openapi_body(*models: type[BaseModel], multipart: dict[str, Any] | None = None) -> dict:
    """``openapi_extra`` for endpoints that parse their body themselves (JSON or multipart)."""
    content: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        if "$defs" in schema:
            raise ValueError(f"{model.__name__}: nested models are not supported here")
        content["application/json"] = {"schema": schema}
    if multipart is not None:
        content["multipart/form-data"] = {"schema": multipart}
    return {"requestBody": {"required": True, "content": content}}


def _omitted_when_absent(*names: str):
    """JSON-schema hook: these fields are left out of a body when they have no value, never sent
    as null, so the schema shows their plain type."""

    def hook(schema: dict[str, Any]) -> None:
        for name in names:
            prop = schema["properties"][name]
            prop.pop("default", None)
            branches = [b for b in prop.pop("anyOf", []) if b.get("type") != "null"]
            if branches:
                prop.update(branches[0])

    return hook


class ProblemFieldError(BaseModel):
    """One bad input of a problem: where it is and what is wrong with it."""

    model_config = ConfigDict(title="ProblemFieldError")

    field: str = Field(description="JSON path into the request, e.g. `vectors[3][17]` or `params`")
    message: str = Field(description="what is wrong and, where it helps, what is accepted")


class ProblemDetails(BaseModel):
    """RFC 9457 problem details, as every error of this service is answered
    (`application/problem+json`)."""

    model_config = ConfigDict(
        title="Problem",
        json_schema_extra=_omitted_when_absent("instance", "errors"),
    )

    type: str = Field(
        description="`urn:nobackfill:problem:<slug>`, stable per kind of error "
        "(e.g. `invalid-request`, `not-found`, `conflict`, `request-too-large`)"
    )
    title: str = Field(description="short summary of the kind of error")
    status: int = Field(description="the HTTP status code")
    detail: str = Field(description="what went wrong with this request, in words")
    instance: str | None = Field(default=None, description="the request path")
    errors: list[ProblemFieldError] | None = Field(
        default=None,
        description="one entry per bad input (422; 413 when an array has too many items); "
        "absent otherwise",
    )
