"""Upgrade jobs over HTTP: validation before anything is queued, the job resource, cancel."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import field_names, problem, snapshot
from tests.service.test_datasets_api import make_dataset
from tests.service.test_galleries_api import make_gallery, seed_vectors

# Small networks and few epochs: these tests exercise the service, not the trainers' quality.
QUICK = {"epochs": 2, "hidden_dim": 16}


def quick_upgrade(dataset_id: str, method: str = "procrustes", **extra) -> dict:
    return {"dataset_id": dataset_id, "method": method, "params": QUICK, **extra}


class RecordingRunner:
    """Stands in for the job runner so a job stays queued: records what was submitted."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    def submit(self, job_id: str) -> None:
        self.submitted.append(job_id)


@pytest.fixture
def recorded(client: TestClient):
    state = client.app.state.service
    real, state.runner = state.runner, RecordingRunner()
    yield state.runner
    state.runner = real


def paired_setup(client: TestClient, n: int = 60, name: str = "products") -> tuple[str, str]:
    gallery_id = make_gallery(client, name=name)
    seed_vectors(client, gallery_id, n=n)
    dataset = make_dataset(client, gallery_id=gallery_id, name=f"{name}-new")
    features = np.random.default_rng(1).normal(size=(n, 6)).tolist()
    response = client.post(
        f"/v1/datasets/{dataset['id']}/items",
        json={"ids": [f"item-{i}" for i in range(n)], "features": features},
    )
    assert response.status_code == 200, response.text
    return gallery_id, dataset["id"]


def test_create_queues_with_location_and_replays(
    client: TestClient, recorded: RecordingRunner
) -> None:
    _, dataset_id = paired_setup(client)
    body = {"dataset_id": dataset_id, "method": "procrustes", "seed": 3}
    headers = {"Idempotency-Key": "up-1"}
    created = client.post("/v1/upgrades", json=body, headers=headers)
    assert created.status_code == 202, created.text
    job = created.json()
    assert created.headers["location"] == f"/v1/upgrades/{job['id']}"
    assert job["status"] == "queued" and job["seed"] == 3 and job["model_id"] is None
    assert recorded.submitted == [job["id"]]
    replay = client.post("/v1/upgrades", json=body, headers=headers)
    assert replay.status_code == 202 and replay.json()["id"] == job["id"]
    assert recorded.submitted == [job["id"]]  # a replay does not queue twice
    assert client.get(created.headers["location"]).json()["id"] == job["id"]
    assert [j["id"] for j in client.get("/v1/upgrades").json()["items"]] == [job["id"]]
    methods = client.get("/v1/upgrades/methods").json()
    assert "procrustes" in methods["backbone"]


def test_cancel_a_queued_job(client: TestClient, recorded: RecordingRunner) -> None:
    _, dataset_id = paired_setup(client)
    job = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    cancelled = client.post(f"/v1/upgrades/{job.json()['id']}/cancel")
    assert cancelled.json()["status"] == "cancelled"
    problem(client.post(f"/v1/upgrades/{job.json()['id']}/cancel"), 409)


@pytest.mark.parametrize(
    ("change", "field", "status"),
    [
        ({"method": "sorcery"}, "method", 422),
        ({"dataset_id": "ds_missing"}, None, 404),
        ({"gallery_id": "gal_other"}, "dataset_id", 422),
        ({"base_model_id": "mdl_x"}, "base_model_id", 422),
        ({"eval_fraction": 1.0}, "eval_fraction", 422),
        ({"seed": -1}, "seed", 422),
        ({"params": [1, 2]}, "params", 422),
        ({"params": {"epochs": 0}}, "params", 422),
        ({"params": {"no_such_knob": 1}}, "params", 422),
        ({"eval_fraction": 0.01}, "dataset_id", 422),
        ({"surprise": True}, "surprise", 422),
        ({"objective": "sorcery"}, "objective", 422),
        ({"params": {"objective": "class"}}, "params", 422),
        # No logged queries carry relevance, so there is nothing to measure `query` on.
        ({"objective": "query"}, "objective", 422),
        ({"method": "auto", "objective": "query"}, "objective", 422),
    ],
)
def test_bad_upgrade_requests_queue_nothing(
    client: TestClient, recorded: RecordingRunner, change: dict, field: str | None, status: int
) -> None:
    _, dataset_id = paired_setup(client)
    before = snapshot(client)
    body = {"dataset_id": dataset_id, "method": "procrustes", **change}
    errors = problem(client.post("/v1/upgrades", json=body), status)
    if field:
        assert field in field_names(errors), errors
    assert snapshot(client) == before and recorded.submitted == []


def test_backbone_upgrade_needs_a_paired_gallery(
    client: TestClient, recorded: RecordingRunner
) -> None:
    unpaired = make_dataset(client, name="unpaired")
    errors = problem(
        client.post("/v1/upgrades", json={"dataset_id": unpaired["id"], "method": "procrustes"}),
        422,
    )
    assert field_names(errors) == ["gallery_id"]
    _, few = paired_setup(client, n=3, name="few")
    errors = problem(
        client.post("/v1/upgrades", json={"dataset_id": few, "method": "procrustes"}), 422
    )
    assert "too few" in errors["detail"]
    assert recorded.submitted == []


def test_unknown_upgrade_is_404(client: TestClient) -> None:
    problem(client.get("/v1/upgrades/upg_nope"), 404)
    problem(client.post("/v1/upgrades/upg_nope/cancel"), 404)
    problem(client.get("/v1/models/mdl_nope"), 404)


def test_label_hungry_methods_need_labels(client: TestClient, recorded: RecordingRunner) -> None:
    gallery_id = make_gallery(client)
    vectors = np.random.default_rng(0).normal(size=(60, 4)).tolist()
    ids = [f"item-{i}" for i in range(60)]
    client.post(f"/v1/galleries/{gallery_id}/vectors", json={"ids": ids, "vectors": vectors})
    dataset = make_dataset(client, gallery_id=gallery_id)
    features = np.random.default_rng(1).normal(size=(60, 6)).tolist()
    client.post(f"/v1/datasets/{dataset['id']}/items", json={"ids": ids, "features": features})
    for method in ("bct", "class-map"):
        errors = problem(
            client.post("/v1/upgrades", json={"dataset_id": dataset["id"], "method": method}), 422
        )
        assert (
            field_names(errors) == ["method"] and "needs labels" in errors["errors"][0]["message"]
        )
    assert recorded.submitted == []  # rejected: no job created or queued
    unlabelled_ok = client.post("/v1/upgrades", json={"dataset_id": dataset["id"], "method": "l2"})
    assert unlabelled_ok.status_code == 202, unlabelled_ok.text


def test_method_defaults_to_auto_and_the_objective_is_kept(
    client: TestClient, recorded: RecordingRunner
) -> None:
    _, dataset_id = paired_setup(client)
    default = client.post("/v1/upgrades", json={"dataset_id": dataset_id})
    assert default.status_code == 202, default.text
    assert default.json()["method"] == "auto" and default.json()["params"] == {}
    chosen = client.post(
        "/v1/upgrades",
        json={"dataset_id": dataset_id, "objective": "instance", "params": {"epochs": 3}},
    )
    assert chosen.status_code == 202, chosen.text
    assert chosen.json()["params"] == {"epochs": 3, "objective": "instance"}
    assert len(recorded.submitted) == 2


def test_continual_upgrades_take_no_objective(
    client: TestClient, recorded: RecordingRunner
) -> None:
    dataset = make_dataset(client, name="task-1")
    before = snapshot(client)
    body = {"dataset_id": dataset["id"], "method": "finetune", "objective": "class"}
    assert field_names(problem(client.post("/v1/upgrades", json=body), 422)) == ["objective"]
    assert snapshot(client) == before and recorded.submitted == []
