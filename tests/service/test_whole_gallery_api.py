"""An upgrade's report measures the gallery as its users search it (issue 44 item 2): a gallery
of the fixture's 800 old glosses whose dataset pairs only a seeded 500 of them (every class has
items on both sides) is searched whole by the held-out queries — stay checked against an
independent numpy search, the bridge against the service's own search of the gallery."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.galleries.models import Gallery
from app.ml.upgrade.data import QueryLog, split_for_evaluation, split_queries
from app.upgrades import backbone
from app.vectors.engine import SEARCHED_IN_ENGINE
from tests.service.test_datasets_api import make_dataset
from tests.service.test_queries_api import NEW, OLD, counts, load, npy

N_PAIRED, EVAL_FRACTION, SEED = 500, 0.4, 0


def _setup(client: TestClient, wordnet_small: dict) -> dict:
    """Gallery: every synset's old gloss; dataset: the new glosses of ``paired`` (a seeded 500);
    query log: the lemmas (both models) of 250 paired and 30 unpaired synsets, each relevant to
    its own synset."""
    ids = wordnet_small["synset_id"]
    n = len(ids)
    gallery = client.post(
        "/v1/galleries",
        json={"name": "glosses", "dim": 384, "model_name": OLD, "metric": "cosine"},
    ).json()
    upload = client.post(
        f"/v1/galleries/{gallery['id']}/vectors",
        files={"ids": npy(ids), "vectors": npy(wordnet_small[f"gloss.{OLD}"])},
    )
    assert upload.status_code == 200, upload.text
    perm = np.random.default_rng(7).permutation(n)
    paired, unpaired = np.sort(perm[:N_PAIRED]), np.sort(perm[N_PAIRED:])
    dataset = make_dataset(client, name="glosses-mpnet", gallery_id=gallery["id"])
    items = client.post(
        f"/v1/datasets/{dataset['id']}/items",
        files={"ids": npy(ids[paired]), "features": npy(wordnet_small[f"gloss.{NEW}"][paired])},
    )
    assert items.status_code == 200, items.text
    rows = np.concatenate([paired[:250], unpaired[:30]])
    logged = client.post(
        f"/v1/datasets/{dataset['id']}/queries",
        files={
            "ids": npy(np.array([f"lemma:{i}" for i in ids[rows]])),
            "features": npy(wordnet_small[f"lemma.{NEW}"][rows]),
            "old_vectors": npy(wordnet_small[f"lemma.{OLD}"][rows]),
            "relevant_ids": (None, json.dumps([[str(i)] for i in ids[rows]]), "application/json"),
        },
    )
    assert logged.json()["queries"] == counts(280, 280, 280), logged.text
    return {
        "gallery_id": gallery["id"],
        "dataset_id": dataset["id"],
        "paired": paired,
        "logged": rows,
    }


def _held_out(wordnet_small: dict, setup: dict) -> np.ndarray:
    """Fixture rows (= gallery order) of the held-out queries with a relevant item: the split
    ``load_inputs`` and the trainer make, rebuilt from the setup — paired rows ordered by item
    id, queries by query id, each about its own synset."""
    ids = wordnet_small["synset_id"]
    paired = sorted(ids[setup["paired"]].tolist())
    row_of = {item: n for n, item in enumerate(paired)}
    logged = sorted(setup["logged"].tolist(), key=lambda i: f"lemma:{ids[i]}")
    relevant = [np.array([row_of[ids[i]]] if ids[i] in row_of else []) for i in logged]
    log = QueryLog(np.zeros((len(logged), 1)), relevant=relevant)
    _, eval_idx = split_for_evaluation(N_PAIRED, EVAL_FRACTION, SEED)
    _, eval_q = split_queries(log, eval_idx, EVAL_FRACTION, SEED)
    return np.array([logged[q] for q in eval_q if relevant[q].size])


def _recall10(scores: np.ndarray, relevant: np.ndarray) -> float:
    own = scores[np.arange(len(relevant)), relevant]
    return float(((scores >= own[:, None]).sum(axis=1) <= 10).mean())


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_the_reports_figures_search_the_whole_gallery(client: TestClient, wordnet_small) -> None:
    setup = _setup(client, wordnet_small)
    body = {
        "dataset_id": setup["dataset_id"],
        "method": "procrustes",
        "objective": "query",
        "eval_fraction": EVAL_FRACTION,
        "seed": SEED,
    }
    created = client.post("/v1/upgrades", json=body)
    assert created.status_code == 202, created.text
    job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    report = job["report"]
    # The gallery holds synset i at position i: a query's row is its relevant position.
    queries = relevant = _held_out(wordnet_small, setup)
    assert report["n_eval_queries_with_relevance"] == len(queries)

    # Stay: the old lemma vectors against every old gloss vector of the gallery, by cosine.
    gallery = _unit(wordnet_small[f"gloss.{OLD}"])
    scores = _unit(wordnet_small[f"lemma.{OLD}"][queries]) @ gallery.T
    stay = _recall10(scores, relevant)
    only_paired = np.zeros(gallery.shape[0], dtype=bool)
    only_paired[setup["paired"]] = True
    masked = np.where(only_paired, scores, -np.inf)
    assert _recall10(masked, relevant) > stay + 0.01  # the 300 unpaired items matter here
    assert report["metrics"]["stay"]["query"]["recall@10"] == pytest.approx(stay, abs=0.005)

    # The bridge: the service's own search of the gallery with the model, 10 results.
    url = f"/v1/galleries/{setup['gallery_id']}/search"
    found = client.post(
        url,
        json={
            "model_id": job["model_id"],
            "features": wordnet_small[f"lemma.{NEW}"][queries].tolist(),
            "k": 10,
        },
    )
    assert found.status_code == 200, found.text
    ids = wordnet_small["synset_id"]
    hits = [
        ids[q] in {h["id"] for h in hits}
        for q, hits in zip(queries, found.json()["results"], strict=True)
    ]
    bridge = report["metrics"]["procrustes"]["query"]["recall@10"]
    assert bridge == pytest.approx(float(np.mean(hits)), abs=0.005)

    searched = report["searched"]
    assert (searched["paired_items"], searched["unpaired_items"]) == (N_PAIRED, 300)
    assert searched["query"]["items"] == 800 and not searched["sampled"]


def test_a_large_remainder_is_sampled_and_the_sample_is_stable(
    client: TestClient, wordnet_small, monkeypatch
) -> None:
    """Beyond ``MAX_DISTRACTORS`` unpaired items the upgrade reads a seeded sample of them (the
    same for the upgrade and for the backfill fit that reads its inputs again) and says so."""
    setup = _setup(client, wordnet_small)
    data, _ = load(client, setup["dataset_id"])
    unpaired = np.setdiff1d(np.arange(len(wordnet_small["synset_id"])), setup["paired"])
    # Every unpaired item, ascending internal id (= upload order here), old vectors as stored.
    np.testing.assert_array_equal(data.distractors, wordnet_small[f"gloss.{OLD}"][unpaired])
    assert data.unpaired_total is None and data.n_unpaired == 300

    monkeypatch.setattr(backbone, "MAX_DISTRACTORS", 120)
    sample, _ = load(client, setup["dataset_id"])
    again, _ = load(client, setup["dataset_id"])
    assert sample.n_distractors == 120 and sample.unpaired_total == 300
    np.testing.assert_array_equal(sample.distractors, again.distractors)
    rows = [np.flatnonzero((data.distractors == v).all(axis=1))[0] for v in sample.distractors]
    assert rows == sorted(set(rows))  # a subset, in the gallery's order


def test_an_engine_across_the_network_sends_the_sample_by_id_not_every_vector(
    client: TestClient, wordnet_small, monkeypatch
) -> None:
    """Where the vectors live in an engine across the network, a scan ships every vector to draw
    a sample of a few (issue 46: an upgrade of an attached million-point collection read all of
    them for a tenth). The sample is fetched by id there: the same rows, in the same order, as
    the scan reads, and no scan; FAISS galleries keep their local scan."""
    setup = _setup(client, wordnet_small)
    monkeypatch.setattr(backbone, "MAX_DISTRACTORS", 120)
    monkeypatch.setattr(backbone, "FETCH_BATCH", 50)  # several batches
    scanned_rows: list[int] = []
    scan = backbone.storage_for

    def counting_storage(session, gallery):
        storage = scan(session, gallery)

        class Counting(type(storage)):  # type: ignore[misc, valid-type]
            def scan(self, *args, **kwargs):
                for batch in super().scan(*args, **kwargs):
                    scanned_rows.append(len(batch.ids))
                    yield batch

        storage.__class__ = Counting
        return storage

    monkeypatch.setattr(backbone, "storage_for", counting_storage)
    sampled, _ = load(client, setup["dataset_id"])
    with client.app.state.service.db.session() as session:
        engine = session.get(Gallery, setup["gallery_id"]).vector_storage
    n = len(wordnet_small["synset_id"])
    # (A FAISS storage's own reads may scan too: at least one whole scan, counted.)
    assert sum(scanned_rows) == 0 if engine in SEARCHED_IN_ENGINE else sum(scanned_rows) >= n

    scanned_rows.clear()
    monkeypatch.setattr(backbone, "_read_by_id", lambda *_: False)
    by_scan, _ = load(client, setup["dataset_id"])
    assert sum(scanned_rows) >= n
    assert sampled.n_distractors == 120 and sampled.unpaired_total == 300
    np.testing.assert_array_equal(sampled.distractors, by_scan.distractors)
