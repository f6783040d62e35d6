"""Trained models over HTTP: metadata, embed (JSON and .npy), which galleries a model may search
(409 for the others), model-bound galleries, artifacts verified on load and on download, and
deletion (409 while something depends on the model)."""

from __future__ import annotations

import base64
import hashlib

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.ml.methods.models import model_from_bytes
from tests.service.conftest import field_names, problem, snapshot, stop_client
from tests.service.test_galleries_api import (
    EXTERNAL,
    make_gallery,
    npy,
    other_tenant,
    seed_vectors,
)
from tests.service.test_upgrades_api import paired_setup, quick_upgrade


@pytest.fixture
def trained(client: TestClient) -> tuple[str, str]:
    """(gallery id, model id) of a procrustes upgrade on 60 paired items (inline runner)."""
    gallery_id, dataset_id = paired_setup(client)
    job = client.post("/v1/upgrades", json=quick_upgrade(dataset_id))
    done = client.get(job.headers["location"]).json()
    assert done["status"] == "succeeded", done
    return gallery_id, done["model_id"]


FEATURES = np.random.default_rng(1).normal(size=(60, 6))  # what paired_setup uploaded


def test_model_resource_and_embed(client: TestClient, trained: tuple[str, str]) -> None:
    gallery_id, model_id = trained
    model = client.get(f"/v1/models/{model_id}").json()
    assert model["kind"] == "backbone" and model["method"] == "procrustes"
    assert model["gallery_id"] == gallery_id and model["parent_id"] is None
    assert model["space"]["model_name"] == EXTERNAL["model_name"] and model["space"]["dim"] == 4
    assert model["input_dims"] == {"default": 6} and model["rotation_since_parent"] is None
    assert [m["id"] for m in client.get("/v1/models").json()["items"]] == [model_id]
    embedded = client.post(f"/v1/models/{model_id}/embed", json={"features": FEATURES[:3].tolist()})
    assert embedded.status_code == 200, embedded.text
    body = embedded.json()
    assert np.asarray(body["embeddings"]).shape == (3, model["output_dim"])
    assert all(0 < u <= 1 for u in body["uncertainty"])
    bad = client.post(f"/v1/models/{model_id}/embed", json={"features": [[1.0, 2.0]]})
    assert "features[0]" in field_names(problem(bad, 422))
    wrong_modality = client.post(
        f"/v1/models/{model_id}/embed", json={"features": FEATURES[:1].tolist(), "modality": "x"}
    )
    assert field_names(problem(wrong_modality, 422)) == ["modality"]


def test_a_model_searches_every_gallery_of_its_space(
    client: TestClient, trained: tuple[str, str]
) -> None:
    gallery_id, model_id = trained
    query = {"vectors": FEATURES[:2].tolist(), "k": 1, "model_id": model_id}
    assert client.post(f"/v1/galleries/{gallery_id}/search", json=query).status_code == 200
    sibling = make_gallery(client, name="same-space")
    seed_vectors(client, sibling, n=5)
    assert client.post(f"/v1/galleries/{sibling}/search", json=query).status_code == 200
    for other in (
        {"name": "other-model", "model_name": "another-encoder"},
        {"name": "other-dim", "dim": 5},
        {"name": "other-metric", "metric": "dot"},
    ):
        foreign = make_gallery(client, **other)
        body = problem(client.post(f"/v1/galleries/{foreign}/search", json=query), 409)
        assert model_id in body["detail"]
    wrong_dim = {**query, "vectors": [[1.0, 2.0]]}
    assert "vectors[0]" in field_names(
        problem(client.post(f"/v1/galleries/{gallery_id}/search", json=wrong_dim), 422)
    )


def test_model_bound_gallery(client: TestClient, trained: tuple[str, str]) -> None:
    _, model_id = trained
    created = client.post("/v1/galleries", json={"name": "bound", "model_id": model_id})
    assert created.status_code == 201, created.text
    gallery = created.json()
    model = client.get(f"/v1/models/{model_id}").json()
    assert gallery["kind"] == "model" and gallery["model_id"] == model_id
    assert gallery["dim"] == model["output_dim"] and gallery["input_dim"] == 6
    url = f"/v1/galleries/{gallery['id']}"
    vectors = client.post(f"{url}/vectors", json={"ids": ["a"], "vectors": [[1.0] * 6]})
    assert field_names(problem(vectors, 422)) == ["features"]
    ids = [f"f{i}" for i in range(10)]
    uploaded = client.post(f"{url}/vectors", json={"ids": ids, "features": FEATURES[:10].tolist()})
    assert uploaded.json() == {"upserted": 10, "count": 10}, uploaded.text
    found = client.post(
        f"{url}/search", json={"vectors": FEATURES[:10].tolist(), "k": 1, "model_id": model_id}
    )
    assert [row[0]["id"] for row in found.json()["results"]] == ids
    points = client.post(f"/v1/models/{model_id}/embed", json={"features": FEATURES[:3].tolist()})
    own_space = client.post(f"{url}/search", json={"vectors": points.json()["embeddings"], "k": 1})
    assert [row[0]["id"] for row in own_space.json()["results"]] == ids[:3]
    for bad in (
        {"name": "b2", "model_id": "mdl_missing"},
        {"name": "b3", "model_id": model_id, "dim": 4},
        {"name": "b4", "model_id": model_id, "modality": "audio"},
    ):
        assert client.post("/v1/galleries", json=bad).status_code in (404, 422)


def test_models_survive_a_restart_and_corrupt_artifacts_are_refused(
    make_client, client: TestClient, trained: tuple[str, str]
) -> None:
    gallery_id, model_id = trained
    query = {"vectors": FEATURES[:4].tolist(), "k": 2, "model_id": model_id}
    before = client.post(f"/v1/galleries/{gallery_id}/search", json=query).json()
    artifact_dir = client.app.state.service.settings.artifact_dir
    stop_client(client)
    restarted = make_client()
    assert restarted.post(f"/v1/galleries/{gallery_id}/search", json=query).json() == before
    stop_client(restarted)
    [artifact] = artifact_dir.glob(f"{model_id}.*")
    artifact.write_bytes(artifact.read_bytes()[:-10] + b"0123456789")
    corrupted = make_client()
    body = problem(corrupted.post(f"/v1/galleries/{gallery_id}/search", json=query), 500)
    assert "checksum" in body["detail"]


NPY = {"Content-Type": "application/x-npy"}


def test_embed_takes_an_npy_body(client: TestClient, trained: tuple[str, str]) -> None:
    _, model_id = trained
    url = f"/v1/models/{model_id}/embed"
    as_json = client.post(url, json={"features": FEATURES[:5].tolist()})
    as_npy = client.post(url, content=npy(FEATURES[:5].astype(np.float32)), headers=NPY)
    assert as_npy.status_code == 200, as_npy.text
    np.testing.assert_allclose(as_npy.json()["embeddings"], as_json.json()["embeddings"], atol=1e-6)
    before = snapshot(client)
    for body, params, field in (
        (b"not numpy", {}, "features"),
        (npy(np.ones((2, 5), dtype=np.float32)), {}, "features"),
        (npy(np.ones(6, dtype=np.float32)), {}, "features"),
        (npy(np.ones((1, 6), dtype=np.int32)), {}, "features"),
        (npy(np.ones((1, 6), dtype=np.float32)), {"modality": "audio"}, "modality"),
    ):
        bad = client.post(url, params=params, content=body, headers=NPY)
        assert field in field_names(problem(bad, 422)) or field in bad.json()["detail"]
    mixed = client.post(url, params={"modality": "default"}, json={"features": [[1.0] * 6]})
    assert field_names(problem(mixed, 422)) == ["modality"]
    problem(client.post(url, content=b"1,2", headers={"Content-Type": "text/csv"}), 415)
    problem(client.post("/v1/models/mdl_missing/embed", content=npy(FEATURES), headers=NPY), 404)
    assert snapshot(client) == before


def test_artifact_download_is_verified(client: TestClient, trained: tuple[str, str]) -> None:
    _, model_id = trained
    model = client.get(f"/v1/models/{model_id}").json()
    response = client.get(f"/v1/models/{model_id}/artifact")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    digest = hashlib.sha256(response.content).hexdigest()
    assert digest == model["artifact_sha256"] and len(response.content) == model["artifact_bytes"]
    assert response.headers["etag"] == f'"{digest}"'
    assert response.headers["repr-digest"] == (
        "sha-256=:" + base64.b64encode(bytes.fromhex(digest)).decode() + ":"
    )
    loaded = model_from_bytes(response.content)  # what the service runs, loadable as data
    assert loaded.output_dim == model["output_dim"]
    cached = client.get(f"/v1/models/{model_id}/artifact", headers={"If-None-Match": f'"{digest}"'})
    assert cached.status_code == 304 and cached.content == b""
    problem(client.get(f"/v1/models/{model_id}/artifact", headers=other_tenant(client)), 404)
    problem(client.get("/v1/models/mdl_missing/artifact"), 404)
    artifact = client.app.state.service.settings.artifact_dir / f"{model_id}.pt"
    artifact.write_bytes(artifact.read_bytes()[:-4] + b"oops")
    body = problem(client.get(f"/v1/models/{model_id}/artifact"), 500)
    assert "checksum" in body["detail"]


def test_delete_model(client: TestClient, trained: tuple[str, str]) -> None:
    gallery_id, model_id = trained
    rival = other_tenant(client)
    bound = client.post("/v1/galleries", json={"name": "bound", "model_id": model_id}).json()
    before = snapshot(client)
    body = problem(client.delete(f"/v1/models/{model_id}"), 409)
    assert bound["id"] in body["detail"]
    problem(client.delete(f"/v1/models/{model_id}", headers=rival), 404)
    problem(client.delete("/v1/models/mdl_missing"), 404)
    assert snapshot(client) == before
    artifact_dir = client.app.state.service.settings.artifact_dir
    assert list(artifact_dir.glob(f"{model_id}.*"))
    assert client.delete(f"/v1/galleries/{bound['id']}").status_code == 204
    # Warm the model cache: a deleted model must not keep answering from it.
    query = {"features": FEATURES[:1].tolist(), "model_id": model_id}
    assert client.post(f"/v1/galleries/{gallery_id}/search", json=query).status_code == 200
    deleted = client.delete(f"/v1/models/{model_id}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert not list(artifact_dir.glob(f"{model_id}.*"))
    problem(client.get(f"/v1/models/{model_id}"), 404)
    problem(client.post(f"/v1/galleries/{gallery_id}/search", json=query), 404)
    problem(client.delete(f"/v1/models/{model_id}"), 404)
    jobs = client.get("/v1/upgrades").json()["items"]
    assert [job["model_id"] for job in jobs] == [None]  # the job stays, its model is gone


def test_a_continual_version_with_children_cannot_be_deleted(client: TestClient) -> None:
    from tests.service.test_continual_api import QUICK, paired_dataset

    first = client.post(
        "/v1/upgrades",
        json={"dataset_id": paired_dataset(client, "t1"), "method": "hmcl-mr", "params": QUICK},
    )
    v1 = client.get(first.headers["location"]).json()["model_id"]
    second = client.post(
        "/v1/upgrades",
        json={
            "dataset_id": paired_dataset(client, "t2"),
            "method": "hmcl-mr",
            "base_model_id": v1,
            "params": QUICK,
        },
    )
    v2 = client.get(second.headers["location"]).json()["model_id"]
    before = snapshot(client)
    assert v2 in problem(client.delete(f"/v1/models/{v1}"), 409)["detail"]
    assert snapshot(client) == before
    assert client.delete(f"/v1/models/{v2}").status_code == 204
    assert client.delete(f"/v1/models/{v1}").status_code == 204
    assert client.get("/v1/models").json()["items"] == []
