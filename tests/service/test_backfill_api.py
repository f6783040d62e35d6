"""Partial backfill over HTTP: re-embedded items stored beside old vectors, the plan, progress,
and the mixed search, on real WordNet vectors (old: MiniLM glosses; new: mpnet)."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.ml.backfill.relevance import fit_relevance
from app.vectors.milvus import search as milvus_search
from app.vectors.milvus.engine import MilvusGallery
from tests.service.conftest import field_names, problem, snapshot
from tests.service.test_queries_api import NEW, OLD, npy, wordnet_setup

N_GALLERY = 400


def upgraded(client: TestClient, wordnet_small: dict) -> dict:
    setup = wordnet_setup(client, wordnet_small, n_gallery=N_GALLERY)
    body = {"dataset_id": setup["dataset_id"], "method": "procrustes", "objective": "query"}
    created = client.post("/v1/upgrades", json=body)
    job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    return setup | {"model_id": job["model_id"]}


def reembed(client: TestClient, setup: dict, wordnet_small: dict, ids: list[str]):
    row = {s: i for i, s in enumerate(wordnet_small["synset_id"][:N_GALLERY])}
    features = wordnet_small[f"gloss.{NEW}"][[row[i] for i in ids]]
    return upload_reembedded(client, setup["gallery_id"], setup["model_id"], ids, features)


def upload_reembedded(
    client: TestClient, gallery_id: str, model_id: str, ids: list[str], features: np.ndarray
):
    """Re-embedded items as multipart .npy parts, ``model_id`` as a JSON string."""
    return client.post(
        f"/v1/galleries/{gallery_id}/vectors",
        files={
            "ids": npy(np.array(ids)),
            "features": npy(features),
            "model_id": (None, f'"{model_id}"', "application/json"),
        },
    )


def test_plan_reembed_progress_and_mixed_search(client: TestClient, wordnet_small) -> None:
    setup = upgraded(client, wordnet_small)
    gallery_url = f"/v1/galleries/{setup['gallery_id']}"
    assert client.get(gallery_url).json()["reembedded"] == []

    planned = client.post(
        f"{gallery_url}/backfill-plan", json={"model_id": setup["model_id"], "fraction": 0.25}
    )
    assert planned.status_code == 200, planned.text
    plan = planned.json()
    assert len(plan["ids"]) == 100 == len(set(plan["ids"]))
    assert set(plan["ids"]) <= set(wordnet_small["synset_id"][:N_GALLERY].tolist())
    assert plan["view"] == "query" and plan["estimator"] in ("expected_gain", "uncertainty")
    fractions = {p["fraction"] for p in plan["expected"]}
    assert {0.0, 0.25, 1.0} <= fractions
    assert {p["metric"] for p in plan["expected"]} == {"recall@1", "recall@10"}

    stored = reembed(client, setup, wordnet_small, plan["ids"])
    assert stored.json() == {"upserted": 100, "count": N_GALLERY, "reembedded": 100}, stored.text
    progress = client.get(gallery_url).json()["reembedded"]
    assert [
        {k: p[k] for k in ("model_id", "reembedded", "total", "fraction")} for p in progress
    ] == [{"model_id": setup["model_id"], "reembedded": 100, "total": N_GALLERY, "fraction": 0.25}]
    assert progress[0]["traffic_covered"] is None  # no access counts uploaded
    # The plan leaves re-embedded items out.
    again = client.post(
        f"{gallery_url}/backfill-plan", json={"model_id": setup["model_id"], "fraction": 0.25}
    ).json()
    assert again["ids"] == [] and again["reembedded"] == 100
    more = client.post(
        f"{gallery_url}/backfill-plan", json={"model_id": setup["model_id"], "count": 10}
    ).json()
    assert len(more["ids"]) == 10 and not set(more["ids"]) & set(plan["ids"])

    queries = wordnet_small[f"lemma.{NEW}"][:20]
    search = {"model_id": setup["model_id"], "features": queries.tolist(), "k": 10}
    results = client.post(f"{gallery_url}/search", json=search)
    assert results.status_code == 200, results.text
    spaces = {h["space"] for hits in results.json()["results"] for h in hits}
    assert spaces == {"new", "old"}
    for hits in results.json()["results"]:
        assert len(hits) == 10
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
    # Old-space searches are untouched.
    old = client.post(
        f"{gallery_url}/search", json={"vectors": wordnet_small[f"lemma.{OLD}"][:2].tolist()}
    ).json()
    assert all("space" not in h for hits in old["results"] for h in hits)

    # Everything re-embedded: the order is the new backbone's own (a full reindex).
    everything = wordnet_small["synset_id"][:N_GALLERY].tolist()
    assert reembed(client, setup, wordnet_small, everything).json()["reembedded"] == N_GALLERY
    hits = client.post(f"{gallery_url}/search", json=search).json()["results"]
    docs = wordnet_small[f"gloss.{NEW}"][:N_GALLERY]
    docs = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    cos = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ docs.T
    for q, row in enumerate(hits):
        assert [h["id"] for h in row] == [everything[i] for i in np.argsort(-cos[q])[:10]]
        assert {h["space"] for h in row} == {"new"}

    # Replacing an item's old vector drops its (now stale) re-embedded features.
    replaced = client.post(
        f"{gallery_url}/vectors",
        json={"ids": [everything[0]], "vectors": [wordnet_small[f"gloss.{OLD}"][0].tolist()]},
    )
    assert replaced.status_code == 200
    assert client.get(gallery_url).json()["reembedded"][0]["reembedded"] == N_GALLERY - 1


def test_bad_reembeds_and_plans_change_nothing(client: TestClient, wordnet_small) -> None:
    setup = upgraded(client, wordnet_small)
    gallery_url = f"/v1/galleries/{setup['gallery_id']}"
    ids = wordnet_small["synset_id"][:3].tolist()
    good = wordnet_small[f"gloss.{NEW}"][:3].tolist()
    before = snapshot(client)
    cases = [
        ({"ids": [ids[0], "nope", ids[1], "gone"], "features": [*good, good[0]]}, 422),
        ({"ids": ids, "features": [row[:10] for row in good]}, 422),
        ({"ids": ids, "features": good[:2]}, 422),
        ({"ids": ids, "features": good, "labels": ["a", "b", "c"]}, 422),
        ({"ids": ids, "vectors": good}, 422),
    ]
    names = []
    for body, status in cases:
        response = client.post(
            f"{gallery_url}/vectors", json=body | {"model_id": setup["model_id"]}
        )
        names.append(field_names(problem(response, status)))
    assert names[0] == ["ids[1]", "ids[3]"]
    assert names[3] == ["labels"]
    assert names[4] == ["vectors"]
    unknown = client.post(
        f"{gallery_url}/vectors", json={"ids": ids, "features": good, "model_id": "mod_missing"}
    )
    assert unknown.status_code == 404
    assert snapshot(client) == before
    # A gallery of another space: the model was not trained for it.
    other = client.post(
        "/v1/galleries", json={"name": "other", "dim": 384, "model_name": "x", "metric": "cosine"}
    ).json()
    client.post(
        f"/v1/galleries/{other['id']}/vectors",
        json={"ids": ids, "vectors": wordnet_small[f"gloss.{OLD}"][:3].tolist()},
    )
    before = snapshot(client)
    conflict = client.post(
        f"/v1/galleries/{other['id']}/vectors",
        json={"ids": ids, "features": good, "model_id": setup["model_id"]},
    )
    problem(conflict, 409)
    plan_conflict = client.post(
        f"/v1/galleries/{other['id']}/backfill-plan",
        json={"model_id": setup["model_id"], "fraction": 0.1},
    )
    problem(plan_conflict, 409)
    for body in (
        {"model_id": setup["model_id"]},
        {"model_id": setup["model_id"], "fraction": 0.1, "count": 3},
        {"model_id": setup["model_id"], "fraction": 1.5},
        {"model_id": setup["model_id"], "count": -1},
    ):
        problem(client.post(f"{gallery_url}/backfill-plan", json=body), 422)
    assert snapshot(client) == before
    assert client.get(gallery_url).json()["reembedded"] == []


@pytest.mark.milvus_only
def test_mixed_search_above_the_milvus_top_k_cap(
    client: TestClient, wordnet_small, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mixed search asks the bridged list for k + (re-embedded items) hits; above a Milvus
    server's top-k cap (lowered here to 12) the engine scans exactly and the answer is the same."""
    setup = upgraded(client, wordnet_small)
    gallery_url = f"/v1/galleries/{setup['gallery_id']}"
    ids = wordnet_small["synset_id"][:N_GALLERY].tolist()[::4]
    assert reembed(client, setup, wordnet_small, ids).status_code == 200
    search = {
        "model_id": setup["model_id"],
        "features": wordnet_small[f"lemma.{NEW}"][:20].tolist(),
        "k": 10,
    }
    indexed = client.post(f"{gallery_url}/search", json=search)
    assert indexed.status_code == 200, indexed.text
    monkeypatch.setattr(milvus_search, "MAX_TOPK", 12)
    scans: list[int] = []
    scan = milvus_search.scanned

    def counted_scan(gallery: MilvusGallery, queries: np.ndarray, k: int):
        scans.append(k)
        return scan(gallery, queries, k)

    monkeypatch.setattr(milvus_search, "scanned", counted_scan)
    scanned = client.post(f"{gallery_url}/search", json=search)
    assert scanned.status_code == 200, scanned.text
    assert scans and min(scans) > 12, scans
    for got, expected in zip(scanned.json()["results"], indexed.json()["results"], strict=True):
        assert [h["id"] for h in got] == [h["id"] for h in expected]
        assert [h["space"] for h in got] == [h["space"] for h in expected]
        np.testing.assert_allclose(
            [h["score"] for h in got], [h["score"] for h in expected], rtol=1e-6
        )


def test_deleting_a_model_with_reembedded_items_is_refused_unless_cascaded(
    client: TestClient, wordnet_small
) -> None:
    """Re-embedded features are acknowledged data: deleting the model they were uploaded for
    must not drop them silently (issue 29)."""
    setup = upgraded(client, wordnet_small)
    gallery_url = f"/v1/galleries/{setup['gallery_id']}"
    model_url = f"/v1/models/{setup['model_id']}"
    ids = wordnet_small["synset_id"][:30].tolist()
    assert reembed(client, setup, wordnet_small, ids).status_code == 200
    before = snapshot(client)

    body = problem(client.delete(model_url), 409)
    assert setup["gallery_id"] in body["detail"] and "30" in body["detail"]
    assert "cascade=true" in body["detail"]
    assert snapshot(client) == before
    assert client.get(gallery_url).json()["reembedded"][0]["reembedded"] == 30

    cascaded = client.delete(model_url, params={"cascade": "true"})
    assert cascaded.status_code == 200, cascaded.text
    assert cascaded.json() == {
        "id": setup["model_id"],
        "cascaded": {"reembedded_items": 30, "by_gallery": {setup["gallery_id"]: 30}},
    }
    assert client.get(model_url).status_code == 404
    assert client.get(gallery_url).json()["reembedded"] == []
    assert client.get(gallery_url).json()["count"] == N_GALLERY  # the old vectors stay


def test_deleting_a_gallery_with_reembedded_items_is_refused_unless_cascaded(
    client: TestClient, wordnet_small
) -> None:
    setup = upgraded(client, wordnet_small)
    gallery_url = f"/v1/galleries/{setup['gallery_id']}"
    ids = wordnet_small["synset_id"][:12].tolist()
    assert reembed(client, setup, wordnet_small, ids).status_code == 200
    # The dataset pairs with the gallery: it goes first, as before.
    assert client.delete(f"/v1/datasets/{setup['dataset_id']}").status_code == 204
    before = snapshot(client)

    body = problem(client.delete(gallery_url), 409)
    assert setup["model_id"] in body["detail"] and "12" in body["detail"]
    assert snapshot(client) == before

    cascaded = client.delete(gallery_url, params={"cascade": True})
    assert cascaded.status_code == 200, cascaded.text
    assert cascaded.json() == {
        "id": setup["gallery_id"],
        "cascaded": {"reembedded_items": 12, "by_model": {setup["model_id"]: 12}},
    }
    assert client.get(gallery_url).status_code == 404


def test_cascade_on_a_delete_with_nothing_to_cascade_is_plain(
    client: TestClient, wordnet_small
) -> None:
    setup = upgraded(client, wordnet_small)
    assert client.delete(f"/v1/datasets/{setup['dataset_id']}").status_code == 204
    gone = client.delete(f"/v1/models/{setup['model_id']}", params={"cascade": "true"})
    assert gone.status_code == 200, gone.text
    assert gone.json()["cascaded"] == {"reembedded_items": 0, "by_gallery": {}}
    problem(client.delete(f"/v1/galleries/{setup['gallery_id']}", params={"cascade": "x"}), 422)


def _transition(client: TestClient, url: str, model_id: str, new_q, old_q, k: int = 10):
    body = {"model_id": model_id, "features": new_q.tolist(), "old_vectors": old_q.tolist()}
    return client.post(f"{url}/search", json=body | {"k": k})


@pytest.mark.parametrize("with_maps", [False, True], ids=["tails", "relevance-maps"])
def test_transition_search_from_stay_to_reindex(
    client: TestClient, wordnet_small, monkeypatch, with_maps: bool
) -> None:
    """Both models' query vectors during a migration (issue 29): nothing re-embedded is exactly
    the old model's search, everything re-embedded exactly a reindex, and in between one list
    whose hits say which space scored them — merged on the tails alone (this fixture holds out
    too few queries for a relevance map) and with the maps forced on (fitted on as few as 2
    relevant items), which must keep both ends exact."""
    if with_maps:
        monkeypatch.setattr(
            "app.ml.backfill.plan.fit_relevance", functools.partial(fit_relevance, min_positives=2)
        )
    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}"
    new_q = wordnet_small[f"lemma.{NEW}"][:16]
    old_q = wordnet_small[f"lemma.{OLD}"][:16]
    stay = client.post(f"{url}/search", json={"vectors": old_q.tolist(), "k": 10}).json()
    at_zero = _transition(client, url, setup["model_id"], new_q, old_q)
    assert at_zero.status_code == 200, at_zero.text
    for mine, theirs in zip(at_zero.json()["results"], stay["results"], strict=True):
        assert [h["id"] for h in mine] == [h["id"] for h in theirs]
        assert {h["space"] for h in mine} == {"old"}
    # old_vectors alone is a plain old-space search.
    alone = client.post(f"{url}/search", json={"old_vectors": old_q.tolist(), "k": 10}).json()
    assert [[h["id"] for h in r] for r in alone["results"]] == [
        [h["id"] for h in r] for r in stay["results"]
    ]

    # The upgrade held out logged queries with both models' vectors: the plan shows the
    # transition curve measured on them and the relevance maps the merge uses.
    plan = client.post(
        f"{url}/backfill-plan", json={"model_id": setup["model_id"], "fraction": 0.1}
    ).json()
    curve = {
        p["fraction"]: p["value"] for p in plan["transition_expected"] if p["metric"] == "recall@10"
    }
    assert set(curve) >= {0.0, 1.0}
    assert plan["calibration"]["served"] in ("tail", "relevance")
    maps = plan["calibration"]["maps"]
    assert set(maps) == {"native", "bridged", "old"}
    assert all((m is not None) == with_maps for m in maps.values()), maps

    ids = wordnet_small["synset_id"][:N_GALLERY].tolist()
    assert reembed(client, setup, wordnet_small, ids[::3]).status_code == 200
    mixed = _transition(client, url, setup["model_id"], new_q, old_q).json()["results"]
    assert {h["space"] for hits in mixed for h in hits} == {"new", "old"}
    for hits in mixed:
        assert len(hits) == 10 and len({h["id"] for h in hits}) == 10
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)
    # multipart .npy parts answer the same
    parts = client.post(
        f"{url}/search",
        files={
            "features": npy(new_q),
            "old_vectors": npy(old_q),
            "model_id": (None, f'"{setup["model_id"]}"', "application/json"),
            "k": (None, "10", "application/json"),
        },
    )
    assert parts.status_code == 200, parts.text
    assert [[h["id"] for h in r] for r in parts.json()["results"]] == [
        [h["id"] for h in r] for r in mixed
    ]

    assert reembed(client, setup, wordnet_small, ids).status_code == 200
    full = _transition(client, url, setup["model_id"], new_q, old_q).json()["results"]
    docs = wordnet_small[f"gloss.{NEW}"][:N_GALLERY]
    docs = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    cos = (new_q / np.linalg.norm(new_q, axis=1, keepdims=True)) @ docs.T
    for q, hits in enumerate(full):
        assert [h["id"] for h in hits] == [ids[i] for i in np.argsort(-cos[q])[:10]]
        assert {h["space"] for h in hits} == {"new"}


def test_bad_transition_searches_are_refused_whole(client: TestClient, wordnet_small) -> None:
    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}"
    new_q = wordnet_small[f"lemma.{NEW}"][:4]
    old_q = wordnet_small[f"lemma.{OLD}"][:4]
    model = setup["model_id"]
    fewer = problem(_transition(client, url, model, new_q, old_q[:3]), 422)
    assert field_names(fewer) == ["old_vectors"]
    narrow = problem(_transition(client, url, model, new_q, old_q[:, :5]), 422)
    assert {f.split("[")[0] for f in field_names(narrow)} == {"old_vectors"}
    wrong_features = problem(_transition(client, url, model, new_q[:, :5], old_q), 422)
    assert {f.split("[")[0] for f in field_names(wrong_features)} == {"features"}
    body = {"model_id": model, "old_vectors": old_q.tolist()}
    assert field_names(problem(client.post(f"{url}/search", json=body), 422)) == ["features"]
    both = {"vectors": old_q.tolist(), "old_vectors": old_q.tolist()}
    assert field_names(problem(client.post(f"{url}/search", json=both), 422)) == ["old_vectors"]
    bad_k = client.post(
        f"{url}/search", files={"old_vectors": npy(old_q), "k": (None, "0", "application/json")}
    )
    assert field_names(problem(bad_k, 422)) == ["k"]


def test_an_upgrade_without_the_old_model_never_answers_stay_or_transition(
    client: TestClient, wordnet_small
) -> None:
    setup = wordnet_setup(client, wordnet_small, n_gallery=N_GALLERY)
    body = {"dataset_id": setup["dataset_id"], "method": "procrustes", "objective": "query"}
    created = client.post("/v1/upgrades", json=body | {"old_model_available": False})
    assert created.status_code == 202, created.text
    job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    verdict = job["report"]["recommendation"]
    assert verdict["old_model_available"] is False
    assert verdict["action"] in ("bridge", "reindex", "measure")
    assert "stay not an option" in verdict["why"] and verdict["next_step"]
    # It is a field of the request, never a trainer parameter.
    bad = client.post("/v1/upgrades", json=body | {"params": {"old_model_available": False}})
    assert field_names(problem(bad, 422)) == ["params"]
    default = client.post("/v1/upgrades", json=body)
    verdict = client.get(f"/v1/upgrades/{default.json()['id']}").json()["report"]["recommendation"]
    assert verdict["old_model_available"] is True
    assert verdict["action"] in ("stay", "bridge", "transition", "measure")


def test_multipart_model_id_as_plain_text_or_a_json_string(
    client: TestClient, wordnet_small
) -> None:
    """``curl -F model_id=mdl_…`` sends the id as a plain-text part: re-embedded uploads and
    transition searches take it as they take a JSON string (``"mdl_…"``, with or without a JSON
    content type), so the README's curl lines work as typed (issue 25)."""
    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}"
    model = setup["model_id"]
    row = {s: i for i, s in enumerate(wordnet_small["synset_id"][:N_GALLERY])}
    ids = wordnet_small["synset_id"][:6].tolist()
    features = wordnet_small[f"gloss.{NEW}"][[row[i] for i in ids]]
    forms = [
        {"data": {"model_id": model}},  # curl -F model_id=mdl_…
        {"extra": {"model_id": (None, model)}},
        {"extra": {"model_id": (None, f'"{model}"')}},  # curl --form-string 'model_id="mdl_…"'
        {"extra": {"model_id": (None, f'"{model}"', "application/json")}},
    ]
    for n, form in enumerate(forms):
        stored = client.post(
            f"{url}/vectors",
            files={"ids": npy(np.array(ids[n : n + 1])), "features": npy(features[n : n + 1])}
            | form.get("extra", {}),
            data=form.get("data"),
        )
        assert stored.status_code == 200, (n, stored.text)
        assert stored.json()["reembedded"] == n + 1
    new_q = wordnet_small[f"lemma.{NEW}"][:3]
    old_q = wordnet_small[f"lemma.{OLD}"][:3]
    answers = [
        client.post(
            f"{url}/search",
            files={"features": npy(new_q), "old_vectors": npy(old_q)} | form.get("extra", {}),
            data=form.get("data"),
        )
        for form in forms
    ]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert len({json.dumps(a.json()) for a in answers}) == 1
    # Still refused: an empty id, a broken JSON string, an id no model has.
    before = snapshot(client)
    for value, status, field in (("", 422, "model_id"), ('"mdl_', 422, "model_id")):
        bad = client.post(
            f"{url}/vectors",
            files={"ids": npy(np.array(ids[5:])), "features": npy(features[5:])},
            data={"model_id": value},
        )
        assert field_names(problem(bad, status)) == [field], value
    missing = client.post(
        f"{url}/vectors",
        files={"ids": npy(np.array(ids[5:])), "features": npy(features[5:])},
        data={"model_id": "mdl_missing"},
    )
    assert missing.status_code == 404, missing.text
    assert snapshot(client) == before


def test_features_alone_through_a_model_not_recommended_as_a_bridge_carry_a_warning(
    client: TestClient, wordnet_small
) -> None:
    """Issue 44 item 1: the no-log default served a bridge below staying without a word. A
    features-only search through a model whose verdict is not 'bridge' answers as before, with
    a warning field and header; with old_vectors (transition) it carries none."""
    from app.jobs.models import UpgradeJob
    from app.models.models import TrainedModel

    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}/search"
    features = wordnet_small[f"lemma.{NEW}"][:5].tolist()
    old = wordnet_small[f"lemma.{OLD}"][:5].tolist()

    def verdict_is(action: str) -> None:
        with client.app.state.service.db.sessions() as session:
            model = session.get(TrainedModel, setup["model_id"])
            job = session.get(UpgradeJob, model.upgrade_id)
            job.report = {
                **job.report,
                "recommendation": {**job.report["recommendation"], "action": action},
            }
            session.commit()

    verdict_is("transition")
    warned = client.post(url, json={"model_id": setup["model_id"], "features": features})
    assert warned.status_code == 200
    assert "not 'bridge'" in warned.json()["warning"] and "old_vectors" in warned.json()["warning"]
    assert warned.headers["X-Nobackfill-Warning"] == "bridge-not-shown-better-than-old-model"
    both = client.post(
        url, json={"model_id": setup["model_id"], "features": features, "old_vectors": old}
    )
    assert "warning" not in both.json() and "X-Nobackfill-Warning" not in both.headers
    from app.client.client import Client
    from tests.service.conftest import TEST_KEY

    api = Client("http://testserver", TEST_KEY, transport=client._transport)
    found = api.search(setup["gallery_id"], np.asarray(features), model_id=setup["model_id"])
    assert found.warnings == [warned.json()["warning"]]
    verdict_is("bridge")
    fine = client.post(url, json={"model_id": setup["model_id"], "features": features})
    assert "warning" not in fine.json() and fine.json()["results"] == warned.json()["results"]


def test_a_plan_whose_fit_holds_nan_is_stored_with_null(
    client: TestClient, wordnet_small, monkeypatch
) -> None:
    """Issue 45 item 8: on PostgreSQL backfill-plan answered 500 when held-out gains were
    constant (a NaN in the fit, refused by the JSON column). Stored as null now, on both
    databases, and the plan answers."""
    import math

    from app.migration import reembed as reembed_module
    from app.migration.models import BackfillFit

    real = reembed_module.fit_planner

    def with_nan(*args, **kwargs):
        fit = real(*args, **kwargs)
        fit.validation = {**fit.validation, "spearman_constant_gains": math.nan}
        return fit

    monkeypatch.setattr(reembed_module, "fit_planner", with_nan)
    setup = upgraded(client, wordnet_small)
    plan = client.post(
        f"/v1/galleries/{setup['gallery_id']}/backfill-plan",
        json={"model_id": setup["model_id"], "fraction": 0.1},
    )
    assert plan.status_code == 200, plan.text
    with client.app.state.service.db.sessions() as session:
        stored = session.get(BackfillFit, setup["model_id"])
        assert stored.fit["validation"]["spearman_constant_gains"] is None
