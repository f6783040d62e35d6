"""A two-stage search's stage one without the over-fetch (issue 43's speed target) answers
through the API what the previous path answered: on the test gallery (400 real MiniLM glosses, a
procrustes model, the embedder stand-in answering real MPNet vectors) the same hits with the same
distances and scores — bridged, fused with the old score, and cold (every candidate embedded by
the search) as well as warm. (The batched second stage, ``app.search.ranking``, is checked
against its rule worked candidate by candidate in ``tests/test_stage_one_candidates.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

from app.search import service
from tests.service.test_two_stage_search import embedder, search, setup  # noqa: F401


def previous_stage_one(session, settings, store, gallery, stage, depth):
    """Stage one as it was: the exact search at the depth, over-fetched for its re-rank, and
    the hit scores of the returned points."""
    index = service.index_for(session, store, gallery)
    ids, distances, points = index.search_with_points(
        stage,
        depth,
        overfetch=settings.search_overfetch,
        min_candidates=settings.search_min_candidates,
    )
    return ids, distances, service.hit_scores(gallery, stage, points, distances)


def previous_names(session, gallery, model_id, candidates):
    return service._item_names(session, gallery, candidates.tolist())


def answers(response) -> list[list[tuple]]:
    assert response.status_code == 200, response.text
    return [
        [(h["id"], h["distance"], h["score"], h["space"]) for h in row]
        for row in response.json()["results"]
    ]


def same(got: list[list[tuple]], want: list[list[tuple]]) -> None:
    assert [[h[0] for h in row] for row in got] == [[h[0] for h in row] for row in want]
    assert [[h[3] for h in row] for row in got] == [[h[3] for h in row] for row in want]
    values = [h[1:3] for row in got for h in row]
    expected = [h[1:3] for row in want for h in row]
    np.testing.assert_allclose(values, expected, rtol=1e-6, atol=1e-6)


def test_two_stage_answers_as_the_previous_path(
    setup: dict,  # noqa: F811
    wordnet_small: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = setup["client"]
    from app.jobs.models import UpgradeJob
    from app.models.models import TrainedModel

    # Cold: this search embeds every candidate (the names of all of them were needed).
    cold = search(setup, wordnet_small, rerank={"depth": 30})
    info = cold.json()["rerank"]
    assert info["embedded"] == info["candidates"] == info["scored_new"] > 30
    variants = [
        {"rerank": {"depth": 30}},  # fused would need a fit: plain new-model order
        {"rerank": {"depth": 30}, "old_vectors": None},  # bridged stage one
        {"rerank": {"depth": 60}},  # partly cold: only the new candidates embedded
    ]
    now = [answers(search(setup, wordnet_small, **v)) for v in variants]
    # The served fusion, as an upgrade's fit writes it.
    with client.app.state.service.db.sessions() as session:
        upgrade_id = session.get(TrainedModel, setup["model_id"]).upgrade_id
        job = session.get(UpgradeJob, upgrade_id)
        report = dict(job.report)
        report["two_stage"] = dict(report.get("two_stage") or {}) | {
            "fusion": {
                "weight": 0.4,
                "scale": {"old_mean": 0.1, "old_std": 0.1, "new_mean": 0.05, "new_std": 0.08},
            }
        }
        job.report = report
        session.commit()
    fused = answers(search(setup, wordnet_small, rerank={"depth": 30}))
    with monkeypatch.context() as m:
        m.setattr(service, "_stage_one", previous_stage_one)
        m.setattr(service, "_candidate_names", previous_names)
        before_fused = answers(search(setup, wordnet_small, rerank={"depth": 30}))
        with client.app.state.service.db.sessions() as session:
            job = session.get(UpgradeJob, upgrade_id)
            report = dict(job.report)
            report["two_stage"] = {k: v for k, v in report["two_stage"].items() if k != "fusion"}
            job.report = report
            session.commit()
        before = [answers(search(setup, wordnet_small, **v)) for v in variants]
    same(fused, before_fused)
    for got, want in zip(now, before, strict=True):
        same(got, want)
    assert fused != now[0]
