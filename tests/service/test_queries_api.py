"""Query logs over HTTP: logged queries of a gallery-linked dataset (new-backbone features, the
old model's vectors, relevant gallery items), upserted all or nothing; how they reach the trainer;
and upgrades that learn from them on real vectors."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.datasets.models import Dataset
from app.galleries.models import Gallery
from app.jobs.models import UpgradeJob
from app.upgrades import backbone
from tests.service.conftest import field_names, problem, snapshot
from tests.service.test_datasets_api import make_dataset
from tests.service.test_galleries_api import make_gallery, seed_vectors

ITEM_DIM, GALLERY_DIM = 6, 4


def npy(array: np.ndarray) -> tuple[str, bytes, str]:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return ("part.npy", buf.getvalue(), "application/octet-stream")


def linked(client: TestClient, n_items: int = 12, n_gallery: int = 20) -> tuple[str, str]:
    """A gallery of ``n_gallery`` old vectors and a dataset pairing its first ``n_items``."""
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id, n=n_gallery, dim=GALLERY_DIM)
    dataset = make_dataset(client, gallery_id=gallery_id)
    features = np.random.default_rng(1).normal(size=(n_items, ITEM_DIM)).tolist()
    response = client.post(
        f"/v1/datasets/{dataset['id']}/items",
        json={"ids": [f"item-{i}" for i in range(n_items)], "features": features},
    )
    assert response.status_code == 200, response.text
    return gallery_id, dataset["id"]


def queries(ids: list[str], *, old: bool = True, relevant: list[list[str]] | None = None) -> dict:
    rng = np.random.default_rng(len(ids))
    body: dict = {"ids": ids, "features": rng.normal(size=(len(ids), ITEM_DIM)).tolist()}
    if old:
        body["old_vectors"] = rng.normal(size=(len(ids), GALLERY_DIM)).tolist()
    if relevant is not None:
        body["relevant_ids"] = relevant
    return body


def counts(count: int, with_old: int, with_relevance: int) -> dict:
    return {"count": count, "with_old_vectors": with_old, "with_relevance": with_relevance}


def test_upload_upsert_count_and_clear(client: TestClient) -> None:
    _, dataset_id = linked(client)
    url = f"/v1/datasets/{dataset_id}/queries"
    assert client.get(f"/v1/datasets/{dataset_id}").json()["queries"] == counts(0, 0, 0)
    body = queries(["q0", "q1", "q2"], relevant=[["item-0"], ["item-1", "item-15"], []])
    first = client.post(url, json=body)
    assert first.json() == {"upserted": 3, "queries": counts(3, 3, 2)}, first.text
    # Upsert by id: q2 is replaced (now with relevance), q3 is new.
    again = client.post(url, json=queries(["q2", "q3"], relevant=[["item-2"], ["item-3"]]))
    assert again.json() == {"upserted": 2, "queries": counts(4, 4, 4)}, again.text
    dataset = client.get(f"/v1/datasets/{dataset_id}").json()
    assert dataset["queries"] == counts(4, 4, 4) and dataset["count"] == 12
    listed = client.get("/v1/datasets").json()["items"]
    assert listed[0]["queries"] == counts(4, 4, 4)

    assert client.delete(url).json() == {"deleted": 4}
    assert client.get(f"/v1/datasets/{dataset_id}").json()["queries"] == counts(0, 0, 0)
    # An empty log takes queries without old vectors (relevance only) again.
    relevance_only = client.post(url, json=queries(["r"], old=False, relevant=[["item-4"]]))
    assert relevance_only.json() == {"upserted": 1, "queries": counts(1, 0, 1)}


def test_multipart_npy_with_relevance_as_a_json_part(client: TestClient) -> None:
    _, dataset_id = linked(client)
    url = f"/v1/datasets/{dataset_id}/queries"
    rng = np.random.default_rng(0)
    files = {
        "ids": npy(np.array(["q0", "q1"])),
        "features": npy(rng.normal(size=(2, ITEM_DIM)).astype(np.float16)),
        "old_vectors": npy(rng.normal(size=(2, GALLERY_DIM)).astype(np.float32)),
        "relevant_ids": (None, json.dumps([["item-0"], ["item-5", "item-6"]]), "application/json"),
    }
    uploaded = client.post(url, files=files)
    assert uploaded.json() == {"upserted": 2, "queries": counts(2, 2, 2)}, uploaded.text
    old_only = {k: files[k] for k in ("features", "old_vectors")} | {
        "ids": npy(np.array(["q2", "q3"]))
    }
    assert client.post(url, files=old_only).json()["queries"] == counts(4, 4, 2)


def test_queries_fix_the_feature_dimension_of_an_empty_dataset(client: TestClient) -> None:
    gallery_id = make_gallery(client)
    seed_vectors(client, gallery_id, n=5, dim=GALLERY_DIM)
    dataset = make_dataset(client, gallery_id=gallery_id)
    body = {"ids": ["q"], "features": [[1.0] * 5], "relevant_ids": [["item-0"]]}
    assert client.post(f"/v1/datasets/{dataset['id']}/queries", json=body).status_code == 200
    assert client.get(f"/v1/datasets/{dataset['id']}").json()["dims"] == {"default": 5}
    wrong = client.post(
        f"/v1/datasets/{dataset['id']}/items", json={"ids": ["item-0"], "features": [[1.0] * 6]}
    )
    assert field_names(problem(wrong, 422)) == ["features[0]"]


TOO_MANY = [[f"x{i}" for i in range(1001)]]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (queries(["q"], old=False), ["old_vectors", "relevant_ids"]),
        (queries(["q"]) | {"features": [[1.0] * 5]}, ["features[0]"]),
        (queries(["q"]) | {"old_vectors": [[1.0] * 3]}, ["old_vectors[0]"]),
        (queries(["q"]) | {"features": [[1e39] + [0.0] * 5]}, ["features[0][0]"]),
        (queries(["q", "r"]) | {"features": [[0.0] * 6]}, ["features"]),
        (queries(["q", "r"]) | {"old_vectors": [[0.0] * 4]}, ["old_vectors"]),
        (queries(["q", "q"]), ["ids[1]"]),
        (queries(["q"]) | {"ids": []}, ["ids"]),
        (queries(["q"], relevant=[["item-0", "ghost"]]), ["relevant_ids[0][1]"]),
        (queries(["q", "r"], relevant=[["item-0"]]), ["relevant_ids"]),
        (queries(["q"], old=False, relevant=[[]]), ["relevant_ids[0]"]),
        (queries(["q"], relevant=[["item-0", "item-0"]]), ["relevant_ids[0][1]"]),
        (queries(["q"], relevant=TOO_MANY), ["relevant_ids[0]"]),
        (queries(["q"], relevant=[[""]]), ["relevant_ids[0][0]"]),
        (queries(["q"]) | {"relevant_ids": [[1]]}, ["relevant_ids[0][0]"]),
        (queries(["q"]) | {"labels": ["x"]}, ["labels"]),
        ({"ids": ["q"], "old_vectors": [[0.0] * 4]}, ["features"]),
    ],
)
def test_bad_query_uploads_change_nothing(client: TestClient, body: dict, fields: list) -> None:
    _, dataset_id = linked(client)
    url = f"/v1/datasets/{dataset_id}/queries"
    assert client.post(url, json=queries(["kept"], relevant=[["item-0"]])).status_code == 200
    before = snapshot(client)
    errors = problem(client.post(url, json=body), 422)
    assert field_names(errors) == fields, errors
    assert snapshot(client) == before
    assert client.get(f"/v1/datasets/{dataset_id}").json()["queries"] == counts(1, 1, 1)


def test_unknown_relevant_ids_are_named(client: TestClient) -> None:
    _, dataset_id = linked(client)
    body = queries(["q0", "q1"], relevant=[["item-0", "nope"], ["item-19", "gone"]])
    errors = problem(client.post(f"/v1/datasets/{dataset_id}/queries", json=body), 422)
    assert field_names(errors) == ["relevant_ids[0][1]", "relevant_ids[1][1]"]
    assert "'nope' is not in gallery" in errors["detail"]


@pytest.mark.parametrize(
    ("parts", "field"),
    [
        ({"relevant_ids": (None, "[[", "application/json")}, "relevant_ids"),
        ({"relevant_ids": (None, '{"a": 1}', "application/json")}, "relevant_ids"),
        ({"relevant_ids": (None, "[3]", "application/json")}, "relevant_ids[0]"),
        ({"features.text": npy(np.ones((1, ITEM_DIM)))}, "features.text"),
        ({"features": npy(np.ones(ITEM_DIM))}, "features"),
        ({"features": npy(np.ones((1, ITEM_DIM), dtype=np.int64))}, "features"),
        ({"old_vectors": npy(np.ones((2, GALLERY_DIM)))}, "old_vectors"),
        ({"ids": npy(np.ones(1))}, "ids"),
        ({"surprise": (None, "1", "text/plain")}, "surprise"),
    ],
)
def test_bad_multipart_uploads_change_nothing(client: TestClient, parts: dict, field: str) -> None:
    _, dataset_id = linked(client)
    files = {
        "ids": npy(np.array(["q"])),
        "features": npy(np.ones((1, ITEM_DIM), dtype=np.float32)),
        "old_vectors": npy(np.ones((1, GALLERY_DIM), dtype=np.float32)),
    }
    if "features.text" in parts:
        del files["features"]
    before = snapshot(client)
    errors = problem(client.post(f"/v1/datasets/{dataset_id}/queries", files=files | parts), 422)
    assert field in field_names(errors), errors
    assert snapshot(client) == before


def test_missing_multipart_features(client: TestClient) -> None:
    _, dataset_id = linked(client)
    files = {"ids": npy(np.array(["q"])), "old_vectors": npy(np.ones((1, GALLERY_DIM)))}
    errors = problem(client.post(f"/v1/datasets/{dataset_id}/queries", files=files), 422)
    assert field_names(errors) == ["features"]


def test_a_log_has_old_vectors_for_every_query_or_none(client: TestClient) -> None:
    _, dataset_id = linked(client)
    url = f"/v1/datasets/{dataset_id}/queries"
    client.post(url, json=queries(["q0", "q1"], relevant=[["item-0"], ["item-1"]]))
    before = snapshot(client)
    without = queries(["q2"], old=False, relevant=[["item-2"]])
    assert field_names(problem(client.post(url, json=without), 422)) == ["old_vectors"]
    # Replacing only some queries without old vectors is refused too; replacing all of them is
    # a new log.
    partial = queries(["q0"], old=False, relevant=[["item-0"]])
    assert field_names(problem(client.post(url, json=partial), 422)) == ["old_vectors"]
    assert snapshot(client) == before
    whole = queries(["q0", "q1"], old=False, relevant=[["item-0"], ["item-1"]])
    assert client.post(url, json=whole).json()["queries"] == counts(2, 0, 2)
    with_old = queries(["q9"], relevant=[["item-9"]])
    assert field_names(problem(client.post(url, json=with_old), 422)) == ["old_vectors"]


def test_limits(make_client) -> None:
    _, dataset_id = linked(make_client())
    url = f"/v1/datasets/{dataset_id}/queries"
    few = make_client(max_vectors_per_request=2)
    before = snapshot(few)
    too_many = problem(few.post(url, json=queries(["a", "b", "c"])), 413)
    assert field_names(too_many) == ["ids"]
    small = make_client(max_request_bytes=2048)
    problem(small.post(url, json=queries(["a"]) | {"pad": "x" * 4096}), 413)
    assert snapshot(few) == before


def test_a_dataset_without_a_gallery_takes_no_queries(client: TestClient) -> None:
    dataset = make_dataset(client, name="no-gallery")
    before = snapshot(client)
    body = {"ids": ["q"], "features": [[1.0, 2.0]], "old_vectors": [[1.0]]}
    conflict = problem(client.post(f"/v1/datasets/{dataset['id']}/queries", json=body), 409)
    assert "has no gallery" in conflict["detail"]
    assert snapshot(client) == before


def test_another_tenants_dataset_is_not_found(client: TestClient) -> None:
    from app.auth.service import create_key

    _, dataset_id = linked(client)
    with client.app.state.service.db.session() as session:
        as_other = {"Authorization": f"Bearer {create_key(session, 'other-team').key}"}
    url = f"/v1/datasets/{dataset_id}/queries"
    before = snapshot(client)
    problem(client.post(url, json=queries(["q"], relevant=[["item-0"]]), headers=as_other), 404)
    problem(client.delete(url, headers=as_other), 404)
    problem(client.get(f"/v1/datasets/{dataset_id}", headers=as_other), 404)
    problem(client.delete(f"/v1/datasets/{dataset_id}", headers=as_other), 404)
    assert snapshot(client) == before


def load(client: TestClient, dataset_id: str):
    with client.app.state.service.db.session() as session:
        dataset = session.get(Dataset, dataset_id)
        gallery = session.scalar(select(Gallery).where(Gallery.id == dataset.gallery_id))
        return backbone.load_inputs(session, dataset, gallery)


def test_queries_reach_the_trainer_as_paired_rows(client: TestClient) -> None:
    _, dataset_id = linked(client, n_items=12)
    url = f"/v1/datasets/{dataset_id}/queries"
    body = queries(["b", "a", "c"], relevant=[["item-3", "item-15"], ["item-11"], ["item-19"]])
    client.post(url, json=body)
    data, loaded = load(client, dataset_id)
    # Paired rows are ordered by item id: item-0, item-1, item-10, item-11, item-2, …
    row = {f"item-{i}": n for n, i in enumerate(sorted(str(i) for i in range(12)))}
    log = data.queries
    assert log is not None and len(log) == 3
    order = [1, 0, 2]  # queries come ordered by id: a, b, c
    np.testing.assert_array_equal(log.features, np.asarray(body["features"], "f4")[order])
    np.testing.assert_array_equal(log.old_vectors, np.asarray(body["old_vectors"], "f4")[order])
    assert [r.tolist() for r in log.relevant] == [[row["item-11"]], [row["item-3"]], []]
    assert loaded == {
        "paired_items": 12,
        "queries": 3,
        "queries_with_old_vectors": 3,
        "queries_with_relevance": 2,
        "queries_relevant_dropped": 2,  # item-15 and item-19 have no dataset features
    }


def test_a_log_left_with_nothing_to_learn_is_not_loaded(client: TestClient) -> None:
    _, dataset_id = linked(client, n_items=12)
    body = queries(["q"], old=False, relevant=[["item-15"]])
    client.post(f"/v1/datasets/{dataset_id}/queries", json=body)
    data, loaded = load(client, dataset_id)
    assert data.queries is None
    assert loaded["queries"] == 1 and loaded["queries_relevant_dropped"] == 1
    client.delete(f"/v1/datasets/{dataset_id}/queries")
    data, loaded = load(client, dataset_id)
    assert data.queries is None and loaded["queries"] == 0


# ---- upgrades that learn from a query log, on real vectors (tests/fixtures/wordnet_small.npz)

OLD, NEW = "all-MiniLM-L6-v2", "all-mpnet-base-v2"
QUICK = {"epochs": 2, "hidden_dim": 16}


def wordnet_setup(client: TestClient, wordnet_small: dict, n_gallery: int = 400) -> dict:
    """Old gallery: glosses by MiniLM; dataset: the same glosses by mpnet for 300 of them;
    queries: lemmas by both models, each relevant to its own synset's gloss (query→document)."""
    ids = wordnet_small["synset_id"][:n_gallery]
    gallery = client.post(
        "/v1/galleries",
        json={"name": "glosses", "dim": 384, "model_name": OLD, "metric": "cosine"},
    ).json()
    upload = client.post(
        f"/v1/galleries/{gallery['id']}/vectors",
        files={"ids": npy(ids), "vectors": npy(wordnet_small[f"gloss.{OLD}"][:n_gallery])},
    )
    assert upload.status_code == 200, upload.text
    return pair_glosses(client, wordnet_small, gallery["id"], ids)


def pair_glosses(client: TestClient, wordnet_small: dict, gallery_id: str, ids) -> dict:
    """The dataset and query log of ``wordnet_setup`` for a gallery whose item ``ids[i]`` holds
    synset i's gloss (an attached collection names its items by point id)."""
    ids = np.asarray(ids)
    dataset = make_dataset(client, name="glosses-mpnet", gallery_id=gallery_id)
    items = client.post(
        f"/v1/datasets/{dataset['id']}/items",
        files={"ids": npy(ids[:300]), "features": npy(wordnet_small[f"gloss.{NEW}"][:300])},
    )
    assert items.status_code == 200, items.text
    # 120 logged queries: 100 about paired items, 20 about gallery items without features.
    rows = np.r_[0:100, 300:320]
    logged = client.post(
        f"/v1/datasets/{dataset['id']}/queries",
        files={
            "ids": npy(np.array([f"lemma:{i}" for i in ids[rows]])),
            "features": npy(wordnet_small[f"lemma.{NEW}"][rows]),
            "old_vectors": npy(wordnet_small[f"lemma.{OLD}"][rows]),
            "relevant_ids": (None, json.dumps([[str(i)] for i in ids[rows]]), "application/json"),
        },
    )
    assert logged.json()["queries"] == counts(120, 120, 120), logged.text
    return {"gallery_id": gallery_id, "dataset_id": dataset["id"]}


def test_procrustes_upgrade_with_a_query_log(client: TestClient, wordnet_small, monkeypatch):
    """Needs the ML side's objective/UpgradeOutcome.method (issue 10) merged."""
    from app.upgrades import executor

    setup = wordnet_setup(client, wordnet_small)
    phases: list = []
    real_store = executor.store_artifact

    def record_phase(settings, name, blob):
        with client.app.state.service.db.session() as session:
            phases.append(session.scalar(select(UpgradeJob.progress)).get("phase"))
        return real_store(settings, name, blob)

    monkeypatch.setattr(executor, "store_artifact", record_phase)
    body = {"dataset_id": setup["dataset_id"], "method": "procrustes", "objective": "query"}
    created = client.post("/v1/upgrades", json=body)
    assert created.status_code == 202, created.text
    assert created.json()["params"] == {"objective": "query"}
    job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    assert phases == ["storing"]
    assert (job["phase"], job["eta_s"], job["candidate"]) == ("done", None, None)
    report = job["report"]
    assert report["paired_items"] == 300 and report["queries"] == 120
    assert report["queries_with_old_vectors"] == 120 and report["queries_with_relevance"] == 100
    assert report["queries_relevant_dropped"] == 20
    model = client.get(f"/v1/models/{job['model_id']}").json()
    assert model["method"] == "procrustes"

    # The dataset can go now: the model and the finished job stay.
    assert client.delete(f"/v1/datasets/{setup['dataset_id']}").status_code == 204
    assert client.get(f"/v1/models/{job['model_id']}").status_code == 200
    assert client.get(f"/v1/upgrades/{job['id']}").json()["dataset_id"] is None


@pytest.mark.slow
def test_auto_upgrade_serves_the_chosen_method(client: TestClient, wordnet_small) -> None:
    """Needs the ML side's ``auto`` (issue 10) merged."""
    setup = wordnet_setup(client, wordnet_small)
    created = client.post("/v1/upgrades", json={"dataset_id": setup["dataset_id"]})
    assert created.status_code == 202, created.text
    assert created.json()["method"] == "auto"
    job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    assert job["report"]["queries"] == 120 and job["report"]["queries_relevant_dropped"] == 20
    model = client.get(f"/v1/models/{job['model_id']}").json()
    assert model["method"] != "auto"
    assert model["method"] in backbone.METHODS
