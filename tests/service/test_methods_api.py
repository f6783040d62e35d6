"""GET /v1/upgrades/methods: the catalogue agrees with the trainers' own defaults and validation,
and job resources expose the trainer's phase and ETA."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.jobs.models import UpgradeJob
from app.ml.hmcl import METHODS as CONTINUAL_METHODS
from app.ml.hmcl import ContinualParams
from app.ml.methods.compat import LABELLED_ONLY_METHODS, METHOD_ONLY_PARAMS, CompatParams
from app.ml.upgrade.run import BACKBONE_METHODS
from app.upgrades import catalogue
from app.upgrades.schemas import UpgradeOut
from tests.service.conftest import problem
from tests.service.test_upgrades_api import RecordingRunner, paired_setup

PARAMS_OF = {"backbone": CompatParams, "continual": ContinualParams}


def accepted(params_cls: type, name: str, value: Any) -> bool:
    try:
        params_cls.from_dict({name: value})
    except ValueError:
        return False
    return True


def just_outside(value: float | int, direction: int, integer: bool) -> float | int:
    return value + direction if integer else math.nextafter(value, direction * math.inf)


@pytest.fixture(scope="module")
def methods() -> dict[str, Any]:
    return catalogue.catalogue()


def test_endpoint_lists_every_method_with_old_keys(client: TestClient) -> None:
    body = client.get("/v1/upgrades/methods").json()
    assert body["backbone"] == list(BACKBONE_METHODS)
    assert body["continual"] == list(CONTINUAL_METHODS)
    names = [m["name"] for m in body["methods"]]
    assert names == [*BACKBONE_METHODS, *CONTINUAL_METHODS]
    for method in body["methods"]:
        assert method["kind"] in ("backbone", "continual")
        assert method["description"].endswith(".") and len(method["description"]) > 20
        assert isinstance(method["needs_labels"], bool) and method["params"]
    needs = {m["name"] for m in body["methods"] if m["needs_labels"]}
    assert needs == set(LABELLED_ONLY_METHODS) == {"bct", "class-map"}
    problem(client.get("/v1/upgrades/methods", headers={"Authorization": ""}), 401)


def test_defaults_and_types_are_the_dataclasses(methods: dict[str, Any]) -> None:
    """The dataclass's defaults, or for a backbone method what an explicit request of it gets
    (``CompatParams.for_method``: hbct and l2 have served defaults of their own)."""
    for method in methods["methods"]:
        params_cls = PARAMS_OF[method["kind"]]
        if params_cls is CompatParams:
            defaults = CompatParams.for_method(method["name"], None)
        else:
            defaults = params_cls()
        listed = {p["name"]: p for p in method["params"]}
        user_fields = {f.name for f in dataclasses.fields(params_cls)} - {"extra"}
        if params_cls is CompatParams:
            # A setting only other methods read is not this method's to list (it refuses it).
            user_fields -= {
                n for n, only in METHOD_ONLY_PARAMS.items() if method["name"] not in only
            }
        assert set(listed) == user_fields, method["name"]
        for name, spec in listed.items():
            assert spec["default"] == getattr(defaults, name), (method["name"], name)
            expected = {"integer": int, "number": float, "boolean": bool, "string": str}
            if spec["default"] is not None:
                assert type(spec["default"]) is expected[spec["type"]], name
            assert spec["nullable"] == accepted(params_cls, name, None), name


def test_every_stated_range_is_what_from_dict_enforces(methods: dict[str, Any]) -> None:
    checked = 0
    for kind, params_cls in PARAMS_OF.items():
        specs = next(m["params"] for m in methods["methods"] if m["kind"] == kind)
        for spec in specs:
            name, integer = spec["name"], spec["type"] == "integer"
            if spec["type"] not in ("integer", "number"):
                continue
            for key, direction, inclusive in (
                ("minimum", -1, True),
                ("exclusive_minimum", -1, False),
                ("maximum", 1, True),
                ("exclusive_maximum", 1, False),
            ):
                bound = spec.get(key)
                if bound is None:
                    continue
                checked += 1
                assert accepted(params_cls, name, bound) is inclusive, (name, key, bound)
                if inclusive:
                    outside = just_outside(bound, direction, integer)
                    assert not accepted(params_cls, name, outside), (name, key, outside)
                else:
                    inside = just_outside(bound, -direction, integer)
                    assert accepted(params_cls, name, inside), (name, key, inside)
            # No stated bound on a side: a far value on that side is accepted.
            far = 10**9 if integer else 1e30
            if spec.get("minimum") is None and spec.get("exclusive_minimum") is None:
                assert accepted(params_cls, name, -far), name
            if spec.get("maximum") is None and spec.get("exclusive_maximum") is None:
                assert accepted(params_cls, name, far), name
    assert checked >= 30, checked


def test_known_rules_read_back(methods: dict[str, Any]) -> None:
    """A few rules read in validate(), as the catalogue states them."""
    by_kind = {
        m["kind"]: {p["name"]: p for p in m["params"]}
        for m in methods["methods"]
        if m["name"] in ("hbct", "hmcl-ca")
    }
    compat, continual = by_kind["backbone"], by_kind["continual"]
    assert compat["epochs"]["minimum"] == 1 and compat["epochs"]["maximum"] == 10_000
    assert compat["dropout"]["minimum"] == 0.0 and compat["dropout"]["exclusive_maximum"] == 1.0
    assert compat["lr"]["exclusive_minimum"] == 0.0 and compat["lr"].get("maximum") is None
    assert compat["uncertainty"]["choices"] == ["auto", "norm", "knn", "none"]
    assert continual["anchor"]["exclusive_minimum"] == 0.0
    assert continual["anchor"]["exclusive_maximum"] == 1.0
    assert continual["energy"]["maximum"] == 1.0
    assert continual["rotation"]["nullable"] and "procrustes" in continual["rotation"]["choices"]


def test_choices_are_exactly_what_validation_accepts(methods: dict[str, Any]) -> None:
    for method in methods["methods"]:
        params_cls = PARAMS_OF[method["kind"]]
        for spec in method["params"]:
            if spec.get("choices") is None:
                continue
            for choice in spec["choices"]:
                assert accepted(params_cls, spec["name"], choice), (spec["name"], choice)
            assert not accepted(params_cls, spec["name"], spec["choices"][0] + "x")


def test_a_method_without_a_sentence_still_gets_one() -> None:
    assert catalogue.describe("brand-new", "backbone").endswith(".")
    assert "auto" in catalogue.DESCRIPTIONS


def test_phase_and_eta_come_from_progress() -> None:
    base = {
        "id": "upg_1",
        "status": "running",
        "method": "auto",
        "dataset_id": "ds_1",
        "gallery_id": "gal_1",
        "base_model_id": None,
        "params": {},
        "seed": 0,
        "eval_fraction": 0.2,
        "model_id": None,
        "report": None,
        "error": None,
        "attempts": 1,
        "cancel_requested": False,
        "created_at": "2026-01-01T00:00:00Z",
        "started_at": None,
        "finished_at": None,
    }
    running = {"epoch": 3, "epochs": 40, "phase": "training", "eta_s": 12.5, "candidate": "hbct"}
    out = UpgradeOut.model_validate({**base, "progress": running})
    assert (out.phase, out.eta_s, out.candidate) == ("training", 12.5, "hbct")
    empty = UpgradeOut.model_validate({**base, "progress": {}})
    assert (empty.phase, empty.eta_s, empty.candidate) == (None, None, None)
    odd = UpgradeOut.model_validate({**base, "progress": {"phase": 3, "eta_s": float("nan")}})
    assert (odd.phase, odd.eta_s) == (None, None)
    finished = {**base, "progress": running}
    for status, phase in (("succeeded", "done"), ("failed", None), ("cancelled", None)):
        out = UpgradeOut.model_validate({**finished, "status": status})
        assert (out.phase, out.eta_s, out.candidate) == (phase, None, None)
    assert UpgradeOut.model_json_schema()["properties"]["eta_s"]["description"]


def test_job_resource_shows_the_reported_phase(client: TestClient) -> None:
    state = client.app.state.service
    real, state.runner = state.runner, RecordingRunner()
    try:
        _, dataset_id = paired_setup(client)
        job = client.post("/v1/upgrades", json={"dataset_id": dataset_id, "method": "procrustes"})
        assert job.status_code == 202, job.text
        assert job.json()["phase"] is None and job.json()["eta_s"] is None
        with state.db.sessions() as session:
            row = session.get(UpgradeJob, job.json()["id"])
            row.progress = {"epoch": 1, "epochs": 4, "phase": "evaluating", "eta_s": 7}
            session.commit()
        shown = client.get(f"/v1/upgrades/{job.json()['id']}").json()
        assert shown["phase"] == "evaluating" and shown["eta_s"] == 7.0
        assert shown["progress"]["phase"] == "evaluating"
    finally:
        state.runner = real


def test_the_served_catalogue_states_the_servers_caps(make_client) -> None:
    """Issue 45 item 8: the catalogue advertised epochs ≤ 10,000 and hidden_dim ≤ 65,536 where
    requests were refused above 1,000 / 8,192. Every capped maximum is now the cap: a request at
    it is accepted by the checks, one above it refused naming the parameter."""
    client = make_client(job_max_epochs=7, job_max_hidden_dim=96, job_runner="inline")
    body = client.get("/v1/upgrades/methods").json()
    hbct = next(m for m in body["methods"] if m["name"] == "hbct")
    spec = {p["name"]: p for p in hbct["params"]}
    assert spec["epochs"]["maximum"] == 7 and spec["hidden_dim"]["maximum"] == 96
    assert spec["epochs"].get("exclusive_maximum") is None
    mlp = next(m for m in body["methods"] if m["name"] == "mlp-adapter")
    assert {p["name"]: p for p in mlp["params"]}["adapter_hidden"]["maximum"] == 96
    _, dataset_id = paired_setup(client)
    base = {"dataset_id": dataset_id, "method": "hbct"}
    for name, top in (("epochs", 7), ("hidden_dim", 96)):
        over = client.post("/v1/upgrades", json={**base, "params": {name: top + 1}})
        assert problem(over, 422)["errors"][0]["field"] == f"params.{name}"
    at = client.post("/v1/upgrades", json={**base, "params": {"epochs": 7, "hidden_dim": 96}})
    assert at.status_code == 202, at.text


def test_structure_settings_wider_than_the_data_are_refused(make_client) -> None:
    """Issue 44 item 5: a rank above min(new, old) dimensions or a hidden layer above 4 × the
    wider side is no richer map, only a slower one: 422 naming it (features 6-d, gallery 4-d)."""
    client = make_client(job_runner="inline")
    _, dataset_id = paired_setup(client)
    base = {"dataset_id": dataset_id}
    for method, name, over, fine in (
        ("affine", "adapter_rank", 5, 4),
        ("mlp-adapter", "adapter_hidden", 25, 24),
    ):
        refused = client.post(
            "/v1/upgrades", json={**base, "method": method, "params": {name: over}}
        )
        assert problem(refused, 422)["errors"][0]["field"] == f"params.{name}"
        accepted = client.post(
            "/v1/upgrades", json={**base, "method": method, "params": {name: fine, "epochs": 1}}
        )
        assert accepted.status_code == 202, accepted.text
