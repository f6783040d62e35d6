"""The OpenAPI document tells the truth about errors (problem+json, every status a request can
get), and /docs and /redoc work without the Internet."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.core.errors import PROBLEM_JSON
from app.core.openapi import HANDLER_ERRORS, HTTP_METHODS
from app.core.schemas import ProblemDetails, ProblemFieldError
from tests.service.conftest import problem
from tests.service.test_galleries_api import EXTERNAL, make_gallery

PUBLIC = {"/healthz", "/readyz", "/metrics"}


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in HTTP_METHODS
    ]


def test_every_error_response_is_problem_json(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    ops = operations(schema)
    assert len(ops) >= 20
    for method, path, operation in ops:
        where = (method, path)
        responses = operation["responses"]
        errors = {int(code) for code in responses if code.isdigit() and int(code) >= 400}
        assert 500 in errors, where
        for code in errors:
            content = responses[str(code)]["content"]
            assert list(content) == [PROBLEM_JSON], (where, code)
            assert content[PROBLEM_JSON]["schema"] == {"$ref": "#/components/schemas/Problem"}
            assert responses[str(code)]["description"], (where, code)
        has_inputs = bool(operation.get("parameters") or operation.get("requestBody"))
        if path in PUBLIC:
            assert "security" not in operation and 401 not in errors, where
        else:
            assert path.startswith("/v1/") and operation["security"], where
            assert 401 in errors, where
            assert 422 in errors or not has_inputs, where
        if has_inputs:
            assert 422 in errors, where
        if "{" in path:
            assert 404 in errors, where
        if "requestBody" in operation:
            assert 413 in errors, where
    assert {path for _, path, _ in ops if path in PUBLIC} == PUBLIC
    text = json.dumps(schema)
    assert "HTTPValidationError" not in text and '"ValidationError"' not in text
    problem_schema = schema["components"]["schemas"]["Problem"]
    assert set(problem_schema["required"]) == {"type", "title", "status", "detail"}
    assert set(problem_schema["properties"]) == set(ProblemDetails.model_fields)
    field_error = schema["components"]["schemas"]["ProblemFieldError"]
    assert set(field_error["properties"]) == set(ProblemFieldError.model_fields)


def test_handler_statuses_name_real_operations(client: TestClient) -> None:
    documented = {(m, p) for m, p, _ in operations(client.get("/openapi.json").json())}
    assert set(HANDLER_ERRORS) <= documented, set(HANDLER_ERRORS) - documented


def error_requests(client: TestClient) -> None:
    """One request for each kind of error the API answers."""
    client.get("/v1/galleries", headers={"Authorization": ""})  # 401
    client.get("/v1/galleries", headers={"Authorization": "Bearer nbk_wrong"})  # 401
    client.get("/v1/galleries/gal_missing")  # 404
    client.get("/v1/galleries", params={"limit": 0})  # 422 (query)
    client.post("/v1/galleries", json={"name": "x"})  # 422 (body)
    client.post("/v1/galleries", content=b"{not json", headers={"Content-Type": "application/json"})
    gallery_id = make_gallery(client, name="first")
    client.post("/v1/galleries", json={**EXTERNAL, "name": "first"})  # 409
    make_gallery(client, name="second")
    client.post("/v1/galleries", json={**EXTERNAL, "name": "third"})  # 403
    vectors = np.ones((3, 4)).tolist()
    client.post(  # 413: more items than max_vectors_per_request
        f"/v1/galleries/{gallery_id}/vectors", json={"ids": ["a", "b", "c"], "vectors": vectors}
    )
    client.post(  # 413: a body over max_request_bytes
        f"/v1/galleries/{gallery_id}/vectors",
        content=b"[" + b"0," * 40_000 + b"0]",
        headers={"Content-Type": "application/json"},
    )
    client.post(  # 415
        f"/v1/galleries/{gallery_id}/vectors",
        content=b"ids,vectors",
        headers={"Content-Type": "text/csv"},
    )
    client.post("/v1/upgrades/upg_missing/cancel")  # 404
    client.post("/v1/upgrades", json={"dataset_id": "ds_x", "method": "hbct", "seed": -1})  # 422


def test_every_status_sent_is_documented_with_the_problem_shape(
    make_client: Callable[..., TestClient],
) -> None:
    """Every error the requests above got is documented for its operation (read back from the
    app's own request metrics), and every body has the Problem schema's shape."""
    client = make_client(
        max_galleries_per_tenant=2, max_vectors_per_request=2, max_request_bytes=65_536
    )
    bodies: list[tuple[int, dict[str, Any]]] = []
    original = client.request

    def recording(*args: Any, **kwargs: Any):
        response = original(*args, **kwargs)
        if response.status_code >= 400:
            bodies.append((response.status_code, problem(response, response.status_code)))
        return response

    client.request = recording  # type: ignore[method-assign]
    error_requests(client)
    statuses = {status for status, _ in bodies}
    assert statuses >= {401, 403, 404, 409, 413, 415, 422}, statuses
    for status, body in bodies:
        assert set(body) <= set(ProblemDetails.model_fields), body
        parsed = ProblemDetails.model_validate(body)
        assert parsed.status == status
        assert re.fullmatch(r"urn:nobackfill:problem:[a-z0-9-]+", parsed.type), parsed.type
        for entry in body.get("errors", []):
            assert set(entry) == set(ProblemFieldError.model_fields), entry

    schema = client.get("/openapi.json").json()
    metrics = client.get("/metrics").text
    sent = set()
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "nobackfill_http_requests_total":
                labels = sample.labels
                if int(labels["status"]) >= 400:
                    sent.add((labels["method"].lower(), labels["route"], labels["status"]))
    assert len(sent) >= 8, sent
    for method, route, status in sent:
        documented = schema["paths"][route][method]["responses"]
        assert status in documented, (method, route, status, sorted(documented))


def asset_urls(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)


def test_docs_and_redoc_load_from_the_server_itself(client: TestClient) -> None:
    for page in ("/docs", "/redoc"):
        response = client.get(page, headers={"Authorization": ""})
        assert response.status_code == 200, page
        html = response.text
        assert "cdn" not in html.lower(), page
        assert "http://" not in html and "https://" not in html, page
        urls = asset_urls(html)
        scripts = [u for u in urls if u.endswith(".js")]
        assert scripts, (page, urls)
        for url in urls:
            assert url.startswith("/"), (page, url)
            asset = client.get(url, headers={"Authorization": ""})
            assert asset.status_code == 200, (page, url)
            assert len(asset.content) > 100, (page, url)
        assert "/openapi.json" in html
    swagger = client.get("/docs").text
    assert '"validatorUrl": null' in swagger  # no call to swagger.io's online validator
