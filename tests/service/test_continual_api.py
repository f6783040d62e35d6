"""Continual upgrades over HTTP: what is refused before a job exists, and lineage metadata."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import field_names, problem, snapshot
from tests.service.test_datasets_api import make_dataset
from tests.service.test_galleries_api import make_gallery

QUICK = {"epochs": 2, "min_steps": 0}


def paired_dataset(client: TestClient, name: str, modalities=("image", "text"), n=40, dims=(5, 3)):
    dataset = make_dataset(client, name=name, modalities=list(modalities))
    rng = np.random.default_rng(len(name))
    rows = {m: rng.normal(size=(n, d)).tolist() for m, d in zip(modalities, dims, strict=False)}
    body = {"ids": [f"{name}-{i}" for i in range(n)], "modalities": rows}
    assert client.post(f"/v1/datasets/{dataset['id']}/items", json=body).status_code == 200
    return dataset["id"]


@pytest.fixture
def first_version(client: TestClient) -> str:
    dataset_id = paired_dataset(client, "task-1")
    job = client.post(
        "/v1/upgrades", json={"dataset_id": dataset_id, "method": "hmcl-mr", "params": QUICK}
    )
    done = client.get(job.headers["location"]).json()
    assert done["status"] == "succeeded", done
    return done["model_id"]


def test_versions_chain_and_expose_their_rotation(client: TestClient, first_version: str) -> None:
    v1 = client.get(f"/v1/models/{first_version}").json()
    assert v1["kind"] == "continual" and v1["parent_id"] is None and v1["root_id"] == v1["id"]
    assert sorted(v1["modalities"]) == ["image", "text"]
    assert v1["input_dims"] == {"image": 5, "text": 3}
    dataset_id = paired_dataset(client, "task-2")
    job = client.post(
        "/v1/upgrades",
        json={
            "dataset_id": dataset_id,
            "method": "hmcl-ca",
            "base_model_id": first_version,
            "params": QUICK,
        },
    )
    done = client.get(job.headers["location"]).json()
    assert done["status"] == "succeeded", done
    v2 = client.get(f"/v1/models/{done['model_id']}").json()
    assert v2["parent_id"] == v1["id"] and v2["root_id"] == v1["id"]
    rotation = np.asarray(v2["rotation_since_parent"])
    np.testing.assert_allclose(rotation @ rotation.T, np.eye(v2["output_dim"]), atol=1e-6)
    assert client.get("/v1/upgrades/methods").json()["continual"] == [
        "hmcl-ca",
        "hmcl-mr",
        "finetune",
        "ewc",
    ]


def test_bad_continual_requests_queue_nothing(client: TestClient, first_version: str) -> None:
    good = paired_dataset(client, "task-2")
    single = paired_dataset(client, "single", modalities=("image",), dims=(5,))
    other_dims = paired_dataset(client, "dims", dims=(4, 3))
    other_names = paired_dataset(client, "names", modalities=("image", "audio"))
    gallery_id = make_gallery(client)
    with_gallery = make_dataset(client, name="with-gallery", gallery_id=gallery_id)["id"]
    cases = [
        ({"dataset_id": single}, "dataset_id"),
        ({"dataset_id": with_gallery}, "dataset_id"),
        ({"dataset_id": good, "params": {"epochs": 0}}, "params"),
        ({"dataset_id": good, "params": {"ranks": 3}}, "params"),
        ({"dataset_id": good, "gallery_id": gallery_id}, "gallery_id"),
        ({"dataset_id": other_dims, "base_model_id": first_version}, "dataset_id"),
        ({"dataset_id": other_names, "base_model_id": first_version}, "dataset_id"),
    ]
    before = snapshot(client)
    for body, field in cases:
        errors = problem(client.post("/v1/upgrades", json={"method": "hmcl-ca", **body}), 422)
        assert field in field_names(errors), (body, errors)
    problem(
        client.post(
            "/v1/upgrades",
            json={"method": "ewc", "dataset_id": good, "base_model_id": "mdl_missing"},
        ),
        404,
    )
    assert snapshot(client) == before
