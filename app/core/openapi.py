"""The OpenAPI document: every error response documented as ``application/problem+json``.

FastAPI documents only a 422 ``HTTPValidationError`` in ``application/json``, a body this service
never sends. ``document_problems`` rewrites the generated document once, centrally: each
operation gets the error statuses it can answer, all with the ``Problem`` schema of
``app.core.errors``. Most follow from the operation itself:

- every operation: 500 (an unexpected failure, logged);
- it takes an API key (``security``): 401;
- it has parameters or a body: 422 (the handler of ``RequestValidationError`` and ``invalid``);
- a path parameter: 404 (a missing id, or another tenant's);
- a request body: 413 (``NOBACKFILL_MAX_REQUEST_BYTES``, items per request), and 415 when it
  reads more than JSON (multipart, ``.npy``);
- an ``Idempotency-Key`` header: 409 (a concurrent request with the same key).

Statuses only a handler's logic decides (a tenant limit's 403, a name's 409) are declared where
the route is, with FastAPI's ``responses={409: {"description": ...}}``, or for now in
``HANDLER_ERRORS`` below; either way they get the ``Problem`` schema here.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI

from app.core.errors import PROBLEM_JSON
from app.core.schemas import ProblemDetails

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "options", "head", "trace")
PROBLEM_REF = "#/components/schemas/Problem"

DESCRIPTIONS = {
    401: "No API key, or an unknown or revoked one (`Authorization: Bearer <key>`)",
    403: "A limit of this tenant is reached; `detail` names the setting",
    404: "The resource does not exist, or belongs to another tenant",
    409: "The request conflicts with the resource's state or a concurrent request",
    413: "The body exceeds NOBACKFILL_MAX_REQUEST_BYTES, or an array has more items than "
    "NOBACKFILL_MAX_VECTORS_PER_REQUEST; split the request",
    415: "The body's Content-Type is not one this operation reads",
    422: "Invalid input; `errors` names each bad field and what is wrong with it",
    500: "The server failed; the error was logged",
    503: "A dependency does not answer; `detail` names it",
}

# Statuses that only a handler's logic decides, for routes that do not declare them yet
# (method, path template) → {status: description}. Checked against the routes by the tests.
HANDLER_ERRORS: dict[tuple[str, str], dict[int, str]] = {
    ("post", "/v1/galleries"): {
        403: "The tenant has NOBACKFILL_MAX_GALLERIES_PER_TENANT galleries",
        409: "The name is already used by another gallery of this tenant",
    },
    ("post", "/v1/datasets"): {
        403: "The tenant has NOBACKFILL_MAX_DATASETS_PER_TENANT datasets",
        409: "The name is already used by another dataset of this tenant",
    },
    ("delete", "/v1/galleries/{gallery_id}"): {
        409: "Datasets still pair their items with this gallery, or upgrades are training on it",
    },
    ("post", "/v1/galleries/{gallery_id}/search"): {
        409: "The model given cannot reach this gallery's space",
    },
}


def inferred_statuses(path: str, operation: dict[str, Any]) -> set[int]:
    """The error statuses an operation can answer, read from the operation itself."""
    statuses = {500}
    parameters = operation.get("parameters", [])
    body = operation.get("requestBody")
    if operation.get("security"):
        statuses.add(401)
    if parameters or body:
        statuses.add(422)
    if "{" in path:
        statuses.add(404)
    if body:
        statuses.add(413)
        if set(body.get("content", {})) - {"application/json"}:
            statuses.add(415)
    if any(p.get("in") == "header" and p["name"].lower() == "idempotency-key" for p in parameters):
        statuses.add(409)
    return statuses


def _problem_response(description: str, status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {PROBLEM_JSON: {"schema": {"$ref": PROBLEM_REF}}},
    }
    if status == 401:
        response["headers"] = {
            "WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}
        }
    return response


def _add_problem_schemas(schema: dict[str, Any]) -> None:
    problem = ProblemDetails.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(problem.pop("$defs", {}))
    components["Problem"] = problem


def _drop_unreferenced(schema: dict[str, Any], names: tuple[str, ...]) -> None:
    components = schema.get("components", {}).get("schemas", {})
    for name in names:
        component = components.pop(name, None)
        if component is not None and f'"#/components/schemas/{name}"' in json.dumps(schema):
            components[name] = component  # still used elsewhere: keep it


def document_problems(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite ``schema`` (an OpenAPI document) in place: every error response problem+json."""
    _add_problem_schemas(schema)
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            responses = operation.setdefault("responses", {})
            declared = {
                int(code): entry.get("description", "")
                for code, entry in responses.items()
                if code.isdigit() and int(code) >= 400
            }
            # FastAPI's own 422 describes its HTTPValidationError body, not ours.
            declared.pop(422, None)
            statuses = {
                **dict.fromkeys(inferred_statuses(path, operation), ""),
                **HANDLER_ERRORS.get((method, path), {}),
                **declared,
            }
            for status, description in statuses.items():
                text = description or DESCRIPTIONS.get(status, "Error")
                responses[str(status)] = _problem_response(text, status)
            operation["responses"] = dict(sorted(responses.items()))
    _drop_unreferenced(schema, ("HTTPValidationError", "ValidationError"))
    return schema


def install_openapi(app: FastAPI) -> None:
    """``app.openapi()`` returns the rewritten document (built once, then cached by FastAPI)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_problems(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
