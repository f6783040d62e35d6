"""Model export (GET /v1/models/{id}/export): the ONNX graph agrees with the service's own model
(onnxruntime vs torch), and searching with it the way manifest.json says, in plain numpy on the
real WordNet fixture, reproduces the service's top-10; bad requests change nothing."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from fastapi.testclient import TestClient

from app.ml.methods.heads import LorentzHead
from app.models.export import ExportTarget, export_onnx
from tests.service.conftest import field_names, problem, snapshot
from tests.service.test_continual_api import paired_dataset
from tests.service.test_datasets_api import make_dataset
from tests.service.test_galleries_api import npy, other_tenant

OLD, NEW = "gloss.all-MiniLM-L6-v2", "gloss.all-mpnet-base-v2"
NPY = {"Content-Type": "application/x-npy"}
# Fast heads: the tests check the export, not the trainers' quality.
METHODS = {"procrustes": {}, "l2": {"epochs": 2, "hidden_dim": 16}}
K = 10


def real_setup(client: TestClient, wordnet: dict, metric: str = "cosine") -> tuple[str, str, list]:
    """(gallery id, dataset id, item ids): the fixture's MiniLM glosses as the old gallery and
    its mpnet glosses as the new backbone's features, uploaded as .npy parts."""
    ids = [str(s) for s in wordnet["synset_id"]]
    created = client.post(
        "/v1/galleries",
        json={"name": "wordnet", "dim": 384, "model_name": "all-MiniLM-L6-v2", "metric": metric},
    )
    gallery_id = created.json()["id"]
    files = {"ids": ("i.npy", npy(np.array(ids))), "vectors": ("v.npy", npy(wordnet[OLD]))}
    uploaded = client.post(f"/v1/galleries/{gallery_id}/vectors", files=files)
    assert uploaded.status_code == 200, uploaded.text
    dataset = make_dataset(client, name="wordnet-new", gallery_id=gallery_id)
    files = {"ids": ("i.npy", npy(np.array(ids))), "features": ("f.npy", npy(wordnet[NEW]))}
    items = client.post(f"/v1/datasets/{dataset['id']}/items", files=files)
    assert items.status_code == 200, items.text
    return gallery_id, dataset["id"], ids


def train(client: TestClient, dataset_id: str, method: str, params: dict) -> str:
    job = client.post(
        "/v1/upgrades", json={"dataset_id": dataset_id, "method": method, "params": params}
    )
    assert job.status_code == 202, job.text
    done = client.get(job.headers["location"]).json()
    assert done["status"] == "succeeded", done
    return done["model_id"]


def unpack(content: bytes, directory: Path) -> dict:
    """Extract a bundle; returns its manifest (after checking every file's recorded digest)."""
    import hashlib

    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        archive.extractall(directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((directory / name).read_bytes()).hexdigest() == digest
    return manifest


def run_onnx(path: Path, inputs: np.ndarray) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    feed = {session.get_inputs()[0].name: inputs.astype(np.float32)}
    return dict(zip(names, session.run(None, feed), strict=True))


def service_search(
    client: TestClient, gallery_id: str, model_id: str, queries: np.ndarray
) -> list[list[dict]]:
    """The service's top-K hits for NEW backbone features searched with ``model_id``."""
    found = client.post(
        f"/v1/galleries/{gallery_id}/search",
        params={"k": K, "model_id": model_id},
        content=npy(queries),
        headers=NPY,
    )
    assert found.status_code == 200, found.text
    return found.json()["results"]


def cosine_matrix(query: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Cosine similarity (float64) of every query with every old vector."""
    query, old = query.astype(np.float64), old.astype(np.float64)
    return (query @ old.T) / np.outer(np.linalg.norm(query, axis=1), np.linalg.norm(old, axis=1))


def assert_same_ranking(
    service_ids: list[list[str]], ours: np.ndarray, similarity: np.ndarray, ids: list[str]
) -> None:
    """Our top-K (indices into ``ids``, best first) equals the service's, rank by rank, except
    where two candidates' similarities tie to float32 precision (then either order is right)."""
    position = {item: n for n, item in enumerate(ids)}
    for row, (theirs, mine) in enumerate(zip(service_ids, ours, strict=True)):
        assert len(theirs) == K
        for rank, (a, b) in enumerate(zip(theirs, mine, strict=True)):
            if position[a] != b:
                gap = abs(similarity[row, position[a]] - similarity[row, b])
                assert gap < 1e-5, (row, rank, a, ids[b], gap)


@pytest.mark.parametrize(
    "method",
    ["procrustes", pytest.param("l2", marks=pytest.mark.slow)],  # l2 trains ~20 s
)
def test_onnx_export_reproduces_the_services_cosine_search(
    client: TestClient, wordnet_small: dict, tmp_path: Path, method: str
) -> None:
    gallery_id, dataset_id, ids = real_setup(client, wordnet_small)
    model_id = train(client, dataset_id, method, METHODS[method])
    model = client.get(f"/v1/models/{model_id}").json()
    response = client.get(f"/v1/models/{model_id}/export", params={"format": "onnx"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zip"
    manifest = unpack(response.content, tmp_path)
    assert manifest["input"] == {
        "name": "features",
        "dim": 768,
        "dtype": "float32",
        "shape": ["batch", 768],
        "description": manifest["input"]["description"],
    }
    assert (
        manifest["output"]["name"] == "query" and manifest["output"]["dim"] == model["output_dim"]
    )
    assert manifest["space"]["model_name"] == "all-MiniLM-L6-v2"
    assert (
        manifest["space"]["metric"] == "cosine"
        and manifest["space"]["lift"] == model["space"]["lift"]
    )
    assert manifest["search"]["kind"] == "cosine" and manifest["search"]["query_output"] == "query"
    assert "gallery_graph" not in manifest

    queries = wordnet_small[NEW][::16]  # 50 real queries, every class represented
    outputs = run_onnx(tmp_path / manifest["graph"], queries)
    # onnxruntime vs the service's torch model (POST /embed runs it).
    embedded = client.post(
        f"/v1/models/{model_id}/embed", content=npy(queries.astype(np.float32)), headers=NPY
    )
    assert embedded.status_code == 200, embedded.text
    torch_points = np.asarray(embedded.json()["embeddings"], dtype=np.float32)
    np.testing.assert_allclose(outputs["point"], torch_points, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(outputs["query"], axis=1), 1.0, atol=1e-5)

    # Plain cosine search of the RAW old vectors with the exported query, as the manifest says.
    cosine = cosine_matrix(outputs["query"], wordnet_small[OLD])
    ours = np.argsort(-cosine, axis=1, kind="stable")[:, :K]
    results = service_search(client, gallery_id, model_id, queries)
    assert_same_ranking([[h["id"] for h in row] for row in results], ours, cosine, ids)
    # The service's score is that cosine.
    position = {item: n for n, item in enumerate(ids)}
    for row, hits in enumerate(results):
        for hit in hits:
            assert hit["score"] == pytest.approx(cosine[row, position[hit["id"]]], abs=1e-5)


def test_onnx_export_of_a_dot_gallery_model_searches_by_lorentz_inner_product(
    client: TestClient, wordnet_small: dict, tmp_path: Path
) -> None:
    gallery_id, dataset_id, ids = real_setup(client, wordnet_small, metric="dot")
    model_id = train(client, dataset_id, "procrustes", {})
    manifest = unpack(client.get(f"/v1/models/{model_id}/export").content, tmp_path)
    assert manifest["search"]["kind"] == "lorentz-inner-product"
    d = manifest["outputs"][1]["dim"]
    assert manifest["output"] == {**manifest["output"], "name": "query", "dim": d + 1}
    graph = manifest["gallery_graph"]
    assert graph["input"]["dim"] == 384 and graph["output"] == {"name": "item", "dim": d + 1}
    items = run_onnx(tmp_path / graph["file"], wordnet_small[OLD])["item"].astype(np.float64)
    queries = wordnet_small[NEW][::16]
    query = run_onnx(tmp_path / manifest["graph"], queries)["query"].astype(np.float64)
    inner = query @ items.T
    ours = np.argsort(-inner, axis=1, kind="stable")[:, :K]
    found = service_search(client, gallery_id, model_id, queries)
    assert_same_ranking([[h["id"] for h in row] for row in found], ours, inner, ids)
    position = {item: n for n, item in enumerate(ids)}
    curv = manifest["curv"]
    for row, hits in enumerate(found):
        for hit in hits:
            expected = inner[row, position[hit["id"]]]
            assert hit["score"] == pytest.approx(expected, rel=1e-5)
            assert hit["distance"] == pytest.approx(
                np.arccosh(-curv * expected) / curv**0.5, abs=1e-3
            )


def test_continual_export_of_one_modality_searches_its_own_items(
    client: TestClient, tmp_path: Path
) -> None:
    dataset_id = paired_dataset(client, "task-1")
    job = client.post(
        "/v1/upgrades",
        json={"dataset_id": dataset_id, "method": "hmcl-mr", "params": {"epochs": 2}},
    )
    model_id = client.get(job.headers["location"]).json()["model_id"]
    manifest = unpack(
        client.get(f"/v1/models/{model_id}/export", params={"modality": "text"}).content, tmp_path
    )
    assert manifest["kind"] == "continual" and manifest["modality"] == "text"
    assert manifest["input"]["dim"] == 3 and manifest["space"] is None
    assert [o["name"] for o in manifest["outputs"]] == ["query", "point", "item"]
    # A model-bound gallery of the text modality, searched by the service and by the export.
    gallery = client.post(
        "/v1/galleries", json={"name": "bound", "model_id": model_id, "modality": "text"}
    ).json()
    features = np.random.default_rng(5).normal(size=(60, 3)).astype(np.float32)
    ids = [f"t{i}" for i in range(60)]
    uploaded = client.post(
        f"/v1/galleries/{gallery['id']}/vectors", json={"ids": ids, "features": features.tolist()}
    )
    assert uploaded.status_code == 200, uploaded.text
    outputs = run_onnx(tmp_path / manifest["graph"], features)
    # The stored vectors (the model's points) are the export's `point` output.
    stored = client.get(f"/v1/galleries/{gallery['id']}/vectors", params={"ids": ids}).json()
    np.testing.assert_allclose(outputs["point"], np.asarray(stored["vectors"]), atol=1e-5)
    inner = outputs["query"][:20].astype(np.float64) @ outputs["item"].astype(np.float64).T
    ours = np.argsort(-inner, axis=1, kind="stable")[:, :K]
    found = client.post(
        f"/v1/galleries/{gallery['id']}/search",
        json={"features": features[:20].tolist(), "k": K, "model_id": model_id, "modality": "text"},
    )
    assert found.status_code == 200, found.text
    found = found.json()["results"]
    assert_same_ranking([[h["id"] for h in row] for row in found], ours, inner, ids)
    default = unpack(client.get(f"/v1/models/{model_id}/export").content, tmp_path / "default")
    assert default["modality"] == client.get(f"/v1/models/{model_id}").json()["modalities"][0]


def test_bad_export_requests_change_nothing(client: TestClient) -> None:
    dataset_id = paired_dataset(client, "task-1")
    job = client.post(
        "/v1/upgrades",
        json={"dataset_id": dataset_id, "method": "hmcl-mr", "params": {"epochs": 2}},
    )
    model_id = client.get(job.headers["location"]).json()["model_id"]
    rival = other_tenant(client)
    before = snapshot(client)
    url = f"/v1/models/{model_id}/export"
    assert field_names(problem(client.get(url, params={"format": "tflite"}), 422)) == ["format"]
    assert field_names(problem(client.get(url, params={"modality": "audio"}), 422)) == ["modality"]
    assert "modality" in field_names(problem(client.get(url, params={"modality": "a b"}), 422))
    problem(client.get("/v1/models/mdl_missing/export"), 404)
    problem(client.get(url, headers=rival), 404)
    assert snapshot(client) == before


def cosine_target(method: str) -> ExportTarget:
    """What the service knows of a small (12 → 6) backbone model of a cosine space."""
    return ExportTarget(
        model_id="mdl_x",
        kind="backbone",
        method=method,
        modality="default",
        input_dim=12,
        output_dim=6,
        curv=1.0,
        space_model_name="old",
        space_dim=6,
        lift={"curv": 1.0, "scale": 1.0, "metric": "cosine"},
    )


def small_cosine_model() -> tuple[LorentzHead, ExportTarget]:
    """A small untrained head (12 → 6) of a cosine space, and what the service knows of it."""
    torch.manual_seed(0)
    model = LorentzHead(12, 6, hidden_dim=8).eval()
    return model, cosine_target("l2")


def test_large_weights_go_to_an_external_data_file(tmp_path: Path) -> None:
    model, target = small_cosine_model()
    manifest = unpack(export_onnx(model, target, external_data_bytes=0), tmp_path)
    assert sorted(manifest["files"]) == ["model.onnx", "model.onnx.data"]
    features = np.random.default_rng(0).normal(size=(1, 12)).astype(np.float32)
    outputs = run_onnx(tmp_path / "model.onnx", features)  # batch 1: the axis is dynamic
    expected = model.embed(features)
    np.testing.assert_allclose(outputs["point"], expected, atol=1e-6)
    np.testing.assert_allclose(
        outputs["query"], expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-6
    )
