"""``centred`` (issue 42 item 2) through the API: advertised for procrustes alone as a boolean,
accepted there, refused with a 422 problem naming it when it is not a boolean or when the method
does not read it; a job without it serves the validated default."""

from __future__ import annotations

from app.ml.methods.compat import CompatParams
from tests.service.conftest import problem
from tests.service.test_upgrades_api import paired_setup


def test_the_catalogue_advertises_centred_for_procrustes_only(make_client) -> None:
    client = make_client(job_runner="inline")
    methods = {m["name"]: m for m in client.get("/v1/upgrades/methods").json()["methods"]}
    (spec,) = [p for p in methods["procrustes"]["params"] if p["name"] == "centred"]
    assert spec["type"] == "boolean" and not spec["nullable"]
    # An explicit procrustes request serves the validated default (METHOD_DEFAULTS).
    assert spec["default"] is CompatParams.for_method("procrustes", None).centred is True
    for other in ("affine", "mlp-adapter", "instance-map", "hbct"):
        assert "centred" not in {p["name"] for p in methods[other]["params"]}, other


def test_centred_is_accepted_and_a_non_boolean_refused(make_client) -> None:
    client = make_client(job_runner="inline")
    _, dataset_id = paired_setup(client)
    base = {"dataset_id": dataset_id, "method": "procrustes"}
    created = client.post("/v1/upgrades", json={**base, "params": {"centred": True}})
    assert created.status_code == 202, created.text
    job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job
    assert job["params"]["centred"] is True
    # A parameter's own rules answer under the field ``params``, the message naming it (as for
    # every CompatParams setting).
    for value in ("yes", 1, None, [True]):
        refused = client.post("/v1/upgrades", json={**base, "params": {"centred": value}})
        (error,) = problem(refused, 422)["errors"]
        assert error["field"] == "params" and "'centred' must be bool" in error["message"], value
    affine = client.post(
        "/v1/upgrades", json={**base, "method": "affine", "params": {"centred": True}}
    )
    (error,) = problem(affine, 422)["errors"]
    assert error["field"] == "params" and "'centred' applies to" in error["message"]
