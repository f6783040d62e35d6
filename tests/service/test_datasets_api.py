"""Datasets over HTTP: paired features per modality, all-or-nothing upserts."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.datasets.models import Dataset
from tests.service.conftest import field_names, problem, snapshot
from tests.service.test_galleries_api import make_gallery, npy, seed_vectors


def make_dataset(client: TestClient, **body) -> dict:
    response = client.post("/v1/datasets", json={"name": "new-features"} | body)
    assert response.status_code == 201, response.text
    return response.json()


def test_create_upload_and_upsert(client: TestClient) -> None:
    dataset = make_dataset(client)
    assert dataset["modalities"] == ["default"] and dataset["count"] == 0
    url = f"/v1/datasets/{dataset['id']}/items"
    first = client.post(url, json={"ids": ["a", "b"], "features": [[1, 2, 3], [4, 5, 6]]})
    assert first.json() == {"upserted": 2, "count": 2}
    again = client.post(url, json={"ids": ["b", "c"], "features": [[0, 0, 1], [1, 1, 1]]})
    assert again.json() == {"upserted": 2, "count": 3}
    assert client.get(f"/v1/datasets/{dataset['id']}").json()["dims"] == {"default": 3}
    listed = client.get("/v1/datasets").json()["items"]
    assert [d["id"] for d in listed] == [dataset["id"]]


def test_several_modalities_json_and_npy(client: TestClient) -> None:
    dataset = make_dataset(client, modalities=["image", "text"])
    url = f"/v1/datasets/{dataset['id']}/items"
    ok = client.post(
        url,
        json={
            "ids": ["a"],
            "modalities": {"image": [[1, 2]], "text": [[1, 2, 3]]},
            "labels": ["x"],
        },
    )
    assert ok.json() == {"upserted": 1, "count": 1}, ok.text
    files = {
        "ids": ("ids.npy", npy(np.array(["b", "c"])), "x"),
        "modalities.image": ("i.npy", npy(np.ones((2, 2), dtype=np.float16)), "x"),
        "modalities.text": ("t.npy", npy(np.ones((2, 3), dtype=np.float32)), "x"),
    }
    uploaded = client.post(url, files=files)
    assert uploaded.json() == {"upserted": 2, "count": 3}, uploaded.text
    assert client.get(f"/v1/datasets/{dataset['id']}").json()["dims"] == {"image": 2, "text": 3}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"ids": ["a"], "modalities": {"image": [[1, 2]]}}, "modalities.text"),
        (
            {"ids": ["a"], "modalities": {"image": [[1, 2]], "text": [[1]], "audio": [[1]]}},
            "modalities.audio",
        ),
        ({"ids": ["a"], "features": [[1, 2]]}, "modalities"),
        (
            {"ids": ["a"], "modalities": {"image": [[1, 2, 9]], "text": [[1, 2, 3]]}},
            "modalities.image",
        ),
        (
            {"ids": ["a", "b"], "modalities": {"image": [[1, 2]], "text": [[1, 2, 3]] * 2}},
            "modalities.image",
        ),
    ],
)
def test_bad_multimodal_uploads_change_nothing(client: TestClient, body: dict, field: str) -> None:
    dataset = make_dataset(client, modalities=["image", "text"])
    url = f"/v1/datasets/{dataset['id']}/items"
    client.post(url, json={"ids": ["z"], "modalities": {"image": [[1, 2]], "text": [[1, 2, 3]]}})
    before = snapshot(client)
    errors = problem(client.post(url, json=body), 422)
    assert any(f.startswith(field) for f in field_names(errors)), errors
    assert snapshot(client) == before


def test_gallery_linked_dataset_requires_gallery_ids(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id, n=5)
    dataset = make_dataset(client, gallery_id=gallery_id)
    url = f"/v1/datasets/{dataset['id']}/items"
    before = snapshot(client)
    unknown = client.post(url, json={"ids": ["item-1", "ghost"], "features": [[1.0], [2.0]]})
    assert field_names(problem(unknown, 422)) == ["ids[1]"]
    assert snapshot(client) == before
    assert client.post(url, json={"ids": ["item-1"], "features": [[1.0]]}).status_code == 200
    # A gallery that datasets pair with cannot be deleted under them.
    problem(client.delete(f"/v1/galleries/{gallery_id}"), 409)


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"name": "d", "gallery_id": "gal_missing"}, 404),
        ({"name": "d", "modalities": []}, 422),
        ({"name": "d", "modalities": ["a", "a"]}, 422),
        ({"name": "d", "modalities": ["../x"]}, 422),
        ({"name": "d/e"}, 422),
    ],
)
def test_bad_dataset_requests(client: TestClient, body: dict, status: int) -> None:
    before = snapshot(client)
    problem(client.post("/v1/datasets", json=body), status)
    assert snapshot(client) == before


def test_unsupported_media_type(client: TestClient) -> None:
    dataset = make_dataset(client)
    response = client.post(
        f"/v1/datasets/{dataset['id']}/items",
        content=b"ids=a",
        headers={"Content-Type": "text/plain"},
    )
    problem(response, 415)


def queue_job(client: TestClient, dataset_id: str, status: str) -> str:
    """An upgrade row on the dataset, as the runner leaves it (no trainer involved)."""
    from app.core.db import new_id
    from app.jobs.models import UpgradeJob

    with client.app.state.service.db.session() as session:
        tenant_id = session.scalar(select(Dataset.tenant_id).where(Dataset.id == dataset_id))
        job = UpgradeJob(
            id=new_id("upg"),
            tenant_id=tenant_id,
            method="procrustes",
            dataset_id=dataset_id,
            params={},
            status=status,
            progress={},
        )
        session.add(job)
    return job.id


def test_delete_takes_items_and_queries(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id, n=5)
    dataset = make_dataset(client, gallery_id=gallery_id)
    kept = make_dataset(client, name="kept", gallery_id=gallery_id)
    for d in (dataset, kept):
        client.post(
            f"/v1/datasets/{d['id']}/items",
            json={"ids": ["item-0", "item-1"], "features": [[1.0, 2.0], [3.0, 4.0]]},
        )
        client.post(
            f"/v1/datasets/{d['id']}/queries",
            json={"ids": ["q"], "features": [[1.0, 0.0]], "relevant_ids": [["item-1"]]},
        )
    before = snapshot(client)
    assert client.delete(f"/v1/datasets/{dataset['id']}").status_code == 204
    after = snapshot(client)
    assert after["datasets"] == before["datasets"] - 1
    assert after["dataset_items"] == before["dataset_items"] - 2
    assert after["dataset_queries"] == before["dataset_queries"] - 1
    problem(client.get(f"/v1/datasets/{dataset['id']}"), 404)
    problem(client.delete(f"/v1/datasets/{dataset['id']}"), 404)
    assert client.get(f"/v1/datasets/{kept['id']}").json()["queries"]["count"] == 1
    assert client.delete(f"/v1/datasets/{kept['id']}").status_code == 204
    # No dataset pairs with the gallery any more: it can go too.
    assert client.delete(f"/v1/galleries/{gallery_id}").status_code == 204


@pytest.mark.parametrize("status", ["queued", "running"])
def test_delete_refused_while_an_upgrade_trains_on_it(client: TestClient, status: str) -> None:
    dataset = make_dataset(client)
    job_id = queue_job(client, dataset["id"], status)
    before = snapshot(client)
    conflict = problem(client.delete(f"/v1/datasets/{dataset['id']}"), 409)
    assert job_id in conflict["detail"]
    assert snapshot(client) == before


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
def test_delete_after_the_upgrades_ended_keeps_them(client: TestClient, status: str) -> None:
    dataset = make_dataset(client)
    job_id = queue_job(client, dataset["id"], status)
    assert client.delete(f"/v1/datasets/{dataset['id']}").status_code == 204
    job = client.get(f"/v1/upgrades/{job_id}").json()
    assert job["status"] == status and job["dataset_id"] is None
