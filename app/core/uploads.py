"""Request bodies given as JSON or as a multipart upload of ``.npy`` arrays."""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic_core
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from app.core.arrays import NPY_MAGIC, load_npy, load_npy_ints, load_npy_strings
from app.core.errors import Problem, invalid, validation_problem
from app.core.limits import ArrayLimits

M = TypeVar("M", bound=BaseModel)


async def read_json_model(request: Request, model: type[M]) -> M:
    body = await request.body()
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_problem(list(exc.errors())) from exc


def parse_json(data: bytes, field: str) -> Any:
    """A JSON part, parsed as the JSON body is: by pydantic-core's parser (the one
    ``model_validate_json`` above runs), so one nesting limit holds for both. ``json.loads`` has
    none of its own: 900 levels stored metadata that could never be serialised back (every read
    of it a 500), 100,000 raised RecursionError. The parser also refuses lone surrogate escapes,
    as the JSON body does.

    A part stands for a member of the JSON body (``{"metadata": <part>}``), one level below its
    root, so it is parsed one level down, inside ``[…]``: both forms then accept exactly the
    same nesting, and what a read returns can be sent back either way. ``[`` + part + ``]`` is
    a one-element array exactly when the part is one JSON value."""
    try:
        (value,) = pydantic_core.from_json(b"[" + data + b"]")
    except ValueError:
        pass
    else:
        return value
    # The error of the part as sent (its own line and column), or else its depth.
    try:
        pydantic_core.from_json(data)
    except ValueError as exc:
        raise invalid(field, f"malformed JSON: {exc}") from exc
    raise invalid(field, "malformed JSON: nested deeper than the JSON body's limit")


def parse_text(data: bytes, field: str) -> str:
    """A string part, as plain text (``curl -F model_id=mdl_…`` sends ``mdl_…``) or as a JSON
    string (``"mdl_…"``, as the Python client and ``--form-string`` send it): a part that starts
    with a double quote is JSON, anything else the text itself."""
    if data.startswith(b'"'):
        return parse_json(data, field)  # one JSON value that opens with a quote: a string
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(field, "expected UTF-8 text or a JSON string") from exc


async def _field_bytes(value: UploadFile | str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    return await value.read()


async def read_body(
    request: Request,
    model: type[BaseModel],
    *,
    array_fields: set[str],
    string_fields: set[str],
    json_fields: set[str],
    limits: ArrayLimits,
    text_fields: frozenset[str] | set[str] = frozenset(),
    int_fields: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Any]:
    """The request's fields: validated JSON (lists), or multipart parts where each of
    ``array_fields`` is a ``.npy`` file of float rows (→ ndarray), each of ``string_fields`` a
    ``.npy`` of strings or a JSON array, each of ``json_fields`` a JSON text and each of
    ``text_fields`` a string (see ``parse_text``), and each of ``int_fields`` a 1-D ``.npy`` of
    integers (→ int64 ndarray, see ``load_npy_ints``) or a JSON array. A field named ``<array_field>.<name>``
    gathers into a dict (several modalities). Every ``.npy`` header is held to ``limits`` before
    its array is loaded."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        parsed = await read_json_model(request, model)
        return {name: getattr(parsed, name) for name in parsed.model_fields_set}
    if content_type != "multipart/form-data":
        raise Problem(
            415,
            "Unsupported media type",
            "send application/json or multipart/form-data with .npy parts",
        )
    allowed = array_fields | string_fields | json_fields | text_fields | int_fields
    fields: dict[str, Any] = {}
    async with request.form(max_files=64, max_fields=64) as form:
        for name, value in form.multi_items():
            prefix, _, sub = name.partition(".")
            if name in fields or (prefix in array_fields and sub and sub in fields.get(prefix, {})):
                raise invalid(name, "given twice")
            if prefix in array_fields and sub:
                rows = load_npy(await _field_bytes(value), name, limits)
                fields.setdefault(prefix, {})[sub] = rows
            elif name in array_fields:
                fields[name] = load_npy(await _field_bytes(value), name, limits)
            elif name in string_fields:
                fields[name] = _strings(await _field_bytes(value), name, limits)
            elif name in int_fields:
                fields[name] = _ints(await _field_bytes(value), name, limits)
            elif name in text_fields:
                fields[name] = parse_text(await _field_bytes(value), name)
            elif name in json_fields:
                fields[name] = parse_json(await _field_bytes(value), name)
            else:
                raise invalid(name, f"unknown part; expected some of {sorted(allowed)}")
    return fields


def _strings(data: bytes, field: str, limits: ArrayLimits) -> list[str]:
    if data.startswith(NPY_MAGIC):
        return load_npy_strings(data, field, limits)
    # The JSON parts' parser (see parse_json): deep nesting is a ValueError, not a
    # RecursionError; an array of strings is shallow, so the one level parse_json adds is moot.
    try:
        values = pydantic_core.from_json(data)
    except ValueError as exc:
        raise invalid(field, "expected a .npy of strings or a JSON array of strings") from exc
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise invalid(field, "expected a JSON array of strings")
    return values


def _ints(data: bytes, field: str, limits: ArrayLimits) -> Any:
    """A ``.npy`` of integers, or a JSON array (checked element by element by the caller's
    model, as the JSON body's would be)."""
    if data.startswith(NPY_MAGIC):
        return load_npy_ints(data, field, limits)
    return parse_json(data, field)
