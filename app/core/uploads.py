"""Request bodies given as JSON or as a multipart upload of ``.npy`` arrays."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from app.core.arrays import load_npy, npy_strings
from app.core.errors import Problem, invalid, validation_problem

M = TypeVar("M", bound=BaseModel)


async def read_json_model(request: Request, model: type[M]) -> M:
    body = await request.body()
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_problem(list(exc.errors())) from exc


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
) -> dict[str, Any]:
    """The request's fields: validated JSON (lists), or multipart parts where each of
    ``array_fields`` is a ``.npy`` file (→ ndarray), each of ``string_fields`` a ``.npy`` of
    strings or a JSON array, and each of ``json_fields`` a JSON text. A field named
    ``<array_field>.<name>`` gathers into a dict (several modalities)."""
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
    allowed = array_fields | string_fields | json_fields
    fields: dict[str, Any] = {}
    async with request.form(max_files=64, max_fields=64) as form:
        for name, value in form.multi_items():
            prefix, _, sub = name.partition(".")
            if name in fields or (prefix in array_fields and sub and sub in fields.get(prefix, {})):
                raise invalid(name, "given twice")
            if prefix in array_fields and sub:
                fields.setdefault(prefix, {})[sub] = load_npy(await _field_bytes(value), name)
            elif name in array_fields:
                fields[name] = load_npy(await _field_bytes(value), name)
            elif name in string_fields:
                fields[name] = _strings(await _field_bytes(value), name)
            elif name in json_fields:
                try:
                    fields[name] = json.loads(await _field_bytes(value))
                except (ValueError, UnicodeDecodeError) as exc:
                    raise invalid(name, f"malformed JSON: {exc}") from exc
            else:
                raise invalid(name, f"unknown part; expected some of {sorted(allowed)}")
    return fields


def _strings(data: bytes, field: str) -> list[str]:
    if data.startswith(b"\x93NUMPY"):
        return npy_strings(load_npy(data, field), field)
    try:
        values = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(field, "expected a .npy of strings or a JSON array of strings") from exc
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise invalid(field, "expected a JSON array of strings")
    return values
