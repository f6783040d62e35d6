"""A migration that drives itself (issue 43, item 6): `POST /v1/galleries/{id}/reembed` queues a
job that sends the gallery's stored texts through the model's embedder (a real server process,
``bench.common.embedder_server``, answering the fixture's recorded mpnet vectors) and stores them
as re-embedded items — progress, a rate limit, cancel, resume after a dead worker, and a failing
embedder that fails the job without storing half a batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.core.db import utcnow
from app.galleries.models import Gallery
from app.jobs.models import QUEUED, RUNNING, UpgradeJob
from app.migration.reembed_job import pace, wait
from app.ml.methods.training import TrainingCancelled, TrainingHooks
from app.upgrades.executor import Claim, execute
from app.vectors.storage import storage_for
from app.vectors.tables import ReembeddedVector
from tests.service.conftest import problem, snapshot, stop_client
from tests.service.test_backfill_api import N_GALLERY, upgraded
from tests.service.test_queries_api import NEW
from tests.service.test_two_stage_search import (  # noqa: F401  (fixtures)
    TEXTS,
    calls,
    control,
    embedder,
    reembedded_rows,
    search,
    with_texts,
)


@pytest.fixture
def migrating(make_client: Callable[..., TestClient], wordnet_small: dict, embedder: str):  # noqa: F811
    """A factory: a client (settings overridden as asked) with an upgraded gallery holding its
    texts and a model whose embedder is the server process."""

    def make(**overrides) -> dict:
        client = make_client(embedder_allowed_urls=[embedder], embedder_max_batch=1024, **overrides)
        state = upgraded(client, wordnet_small)
        created = client.post(
            "/v1/embedders",
            json={
                "name": "mpnet",
                "url": embedder,
                "model": "all-mpnet-base-v2",
                "dimension": 768,
                "max_batch": 100,
            },
        )
        assert created.status_code == 201, created.text
        state |= {"client": client, "embedder": embedder, "embedder_id": created.json()["id"]}
        control(embedder, "ok")
        return state

    return make


def give_texts_and_embedder(state: dict, wordnet_small: dict) -> None:
    client = state["client"]
    with_texts(client, wordnet_small, state["gallery_id"])
    patched = client.patch(
        f"/v1/models/{state['model_id']}", json={"embedder_id": state["embedder_id"]}
    )
    assert patched.status_code == 200, patched.text


def post(state: dict, **body):
    return state["client"].post(
        f"/v1/galleries/{state['gallery_id']}/reembed", json={"model_id": state["model_id"], **body}
    )


def job_of(state: dict, job_id: str) -> dict:
    return state["client"].get(f"/v1/upgrades/{job_id}").json()


def reembedded_names(state: dict) -> list[str]:
    service = state["client"].app.state.service
    with service.db.sessions() as session:
        gallery = session.get(Gallery, state["gallery_id"])
        ids = list(session.scalars(select(ReembeddedVector.vector_id)))
        return [
            item for item, _ in storage_for(session, gallery).names(session, gallery, ids).values()
        ]


def stored_features(client: TestClient) -> dict[int, np.ndarray]:
    with client.app.state.service.db.sessions() as session:
        rows = session.execute(select(ReembeddedVector.vector_id, ReembeddedVector.features))
        return {int(v): np.frombuffer(b, dtype="<f4") for v, b in rows}


def test_the_job_migrates_the_whole_gallery(migrating, wordnet_small: dict) -> None:
    state = migrating()
    give_texts_and_embedder(state, wordnet_small)
    created = post(state)
    assert created.status_code == 202, created.text
    assert created.headers["Location"] == f"/v1/upgrades/{created.json()['id']}"
    job = job_of(state, created.json()["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["method"] == "reembed" and job["model_id"] is None
    report = job["report"]["reembed"]
    assert report["embedded"] == report["targeted"] == report["reembedded"] == N_GALLERY
    assert report["fraction_reembedded"] == 1.0 and report["skipped"] == 0
    assert report["embedder_calls"] == calls(state["embedder"]) == N_GALLERY // 100
    assert job["progress"]["done"] == job["progress"]["total"] == N_GALLERY
    # The stored features are the embedder's vectors of each item's own text.
    features = stored_features(state["client"])
    assert len(features) == N_GALLERY
    expected = wordnet_small[f"gloss.{NEW}"][:N_GALLERY].astype(np.float32)
    assert {tuple(v) for v in features.values()} == {tuple(v) for v in expected}
    # The gallery says so, and a two-stage search has nothing left to embed.
    gallery = state["client"].get(f"/v1/galleries/{state['gallery_id']}").json()
    progress = {p["model_id"]: p for p in gallery["reembedded"]}
    assert progress[state["model_id"]]["reembedded"] == N_GALLERY
    assert search(state, wordnet_small).json()["rerank"]["embedded"] == 0
    listed = state["client"].get(f"/v1/galleries/{state['gallery_id']}/reembed").json()
    assert [j["id"] for j in listed["items"]] == [job["id"]]
    # Everything done: a second job has nothing to embed and calls nobody.
    again = job_of(state, post(state).json()["id"])
    assert again["status"] == "succeeded" and again["report"]["reembed"]["embedded"] == 0
    assert calls(state["embedder"]) == N_GALLERY // 100


def test_a_fraction_goes_in_plan_order_and_a_second_job_embeds_only_the_rest(
    migrating, wordnet_small: dict
) -> None:
    state = migrating()
    give_texts_and_embedder(state, wordnet_small)
    plan = state["client"].post(
        f"/v1/galleries/{state['gallery_id']}/backfill-plan",
        json={"model_id": state["model_id"], "fraction": 0.25},
    )
    assert plan.status_code == 200, plan.text
    quarter = job_of(state, post(state, fraction=0.25).json()["id"])
    assert quarter["status"] == "succeeded", quarter["error"]
    assert quarter["report"]["reembed"]["order"] == "plan"
    assert quarter["report"]["reembed"]["embedded"] == N_GALLERY // 4
    # The plan's items, exactly: the job follows the plan the user sees.
    assert set(reembedded_names(state)) == set(plan.json()["ids"])
    after = state["client"].post(
        f"/v1/galleries/{state['gallery_id']}/backfill-plan",
        json={"model_id": state["model_id"], "fraction": 0.25},
    )
    assert after.json()["reembedded"] == N_GALLERY // 4 and after.json()["ids"] == []
    texts_before = calls(state["embedder"])
    half = job_of(state, post(state, fraction=0.5, order="gallery").json()["id"])
    assert half["report"]["reembed"]["embedded"] == N_GALLERY // 4
    assert half["report"]["reembed"]["reembedded"] == N_GALLERY // 2
    assert calls(state["embedder"]) == texts_before + 1  # 100 texts, one call


def test_a_job_whose_worker_died_resumes_where_it_stopped(migrating, wordnet_small: dict) -> None:
    state = migrating()
    give_texts_and_embedder(state, wordnet_small)
    client = state["client"]
    first = job_of(state, post(state, fraction=0.25).json()["id"])
    assert first["report"]["reembed"]["reembedded"] == N_GALLERY // 4
    # A job for the whole gallery, left running by a worker that died (no heartbeat since).
    service = client.app.state.service
    with service.db.sessions() as session:
        template = session.get(UpgradeJob, first["id"])
        dead = UpgradeJob(
            id="rej_dead",
            tenant_id=template.tenant_id,
            method="reembed",
            gallery_id=template.gallery_id,
            base_model_id=template.base_model_id,
            params={**template.params, "fraction": 1.0},
            status=RUNNING,
            attempts=1,
            worker="celery:gone:1:1",
            progress={"phase": "embedding", "done": 0, "total": 300},
            heartbeat_at=utcnow() - timedelta(hours=1),
        )
        session.add(dead)
        session.commit()
    before = calls(state["embedder"])
    outcome = execute(service.db, service.settings, "rej_dead", worker="test:1:1:1")
    assert outcome is Claim.CLAIMED
    job = job_of(state, "rej_dead")
    assert job["status"] == "succeeded", job["error"]
    assert job["attempts"] == 2
    assert job["report"]["reembed"]["embedded"] == N_GALLERY - N_GALLERY // 4
    assert calls(state["embedder"]) == before + 3  # only the 300 missing, 100 per call
    assert reembedded_rows(client) == N_GALLERY


def test_cancel_stops_between_batches_and_keeps_what_was_stored(
    migrating, make_client, wordnet_small: dict
) -> None:
    state = migrating()
    give_texts_and_embedder(state, wordnet_small)
    # The same data served with jobs in a thread pool, so that the job runs beside the requests.
    stop_client(state["client"])
    client = state["client"] = make_client(
        embedder_allowed_urls=[state["embedder"]], embedder_max_batch=1024, job_runner="thread"
    )
    # 10 items per call at 1,200 a minute: one batch every 0.5 s, 20 s for the gallery.
    created = post(state, batch_size=10, items_per_minute=1200, order="gallery")
    assert created.status_code == 202, created.text
    job_id = created.json()["id"]
    deadline = time.monotonic() + 30
    while job_of(state, job_id)["progress"].get("embedded", 0) < 20:
        assert time.monotonic() < deadline, job_of(state, job_id)
        time.sleep(0.1)
    cancelled = client.post(f"/v1/upgrades/{job_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    while job_of(state, job_id)["status"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    job = job_of(state, job_id)
    assert job["status"] == "cancelled"
    kept = reembedded_rows(client)
    assert 20 <= kept < N_GALLERY and kept % 10 == 0  # whole batches only
    time.sleep(1.0)
    assert reembedded_rows(client) == kept  # nothing after the cancel
    # Posting again resumes: it embeds only what is missing.
    resumed = post(state, order="gallery")
    assert resumed.status_code == 202
    deadline = time.monotonic() + 30
    while job_of(state, resumed.json()["id"])["status"] in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    report = job_of(state, resumed.json()["id"])["report"]["reembed"]
    assert report["embedded"] == N_GALLERY - kept and reembedded_rows(client) == N_GALLERY


@pytest.mark.parametrize("mode", ["error", "nan", "wrong_count"])
def test_a_failing_embedder_fails_the_job_and_stores_no_half_batch(
    migrating, wordnet_small: dict, mode: str
) -> None:
    state = migrating(reembed_retries=1)
    give_texts_and_embedder(state, wordnet_small)
    control(state["embedder"], mode)
    job = job_of(state, post(state).json()["id"])
    assert job["status"] == "failed"
    assert "the embedder failed 2 times in a row" in job["error"]
    assert reembedded_rows(state["client"]) == 0
    assert calls(state["embedder"]) == 2


def test_bad_requests_change_nothing(migrating, wordnet_small: dict) -> None:
    state = migrating()
    client = state["client"]
    before = snapshot(client)
    # No texts and no embedder yet.
    assert "has no embedder" in problem(post(state), 409)["detail"]
    patched = client.patch(
        f"/v1/models/{state['model_id']}", json={"embedder_id": state["embedder_id"]}
    )
    assert patched.status_code == 200
    before = snapshot(client)
    assert "holds no document texts" in problem(post(state), 409)["detail"]
    with_texts(client, wordnet_small, state["gallery_id"])
    before = snapshot(client)
    problem(post(state, fraction=0), 422)
    problem(post(state, fraction=1.5), 422)
    problem(post(state, order="random"), 422)
    problem(post(state, batch_size=0), 422)
    assert (
        "REEMBED_MAX_ITEMS_PER_MINUTE"
        in problem(post(state, items_per_minute=10**9), 422)["detail"]
    )
    problem(post(state, model_id="mdl_missing"), 404)
    problem(client.post("/v1/galleries/gal_missing/reembed", json={"model_id": "x"}), 404)
    assert snapshot(client) == before
    # One job per gallery and model at a time.
    with client.app.state.service.db.sessions() as session:
        session.execute(update(UpgradeJob).values(status=QUEUED))  # the upgrade, as if queued
        session.add(
            UpgradeJob(
                id="rej_queued",
                tenant_id=session.scalar(select(UpgradeJob.tenant_id)),
                method="reembed",
                gallery_id=state["gallery_id"],
                base_model_id=state["model_id"],
                params={"fraction": 1.0, "order": "plan"},
                status=QUEUED,
                progress={},
            )
        )
        session.commit()
    assert "rej_queued" in problem(post(state), 409)["detail"]


def test_pacing_and_waiting_stop_on_cancel() -> None:
    assert pace(0, 60, 0.0) == 0.0
    assert pace(60, 60, 10.0) == pytest.approx(50.0)  # 60 items at 60 a minute: a minute
    assert pace(10, 1200, 5.0) == 0.0  # already slower than the limit
    stop = {"now": False}
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            stop["now"] = True

    hooks = TrainingHooks(should_stop=lambda: stop["now"])
    with pytest.raises(TrainingCancelled):
        wait(60.0, hooks, sleep=sleep)
    assert len(slept) == 3 and all(s <= 0.5 for s in slept)
    wait(0.0, TrainingHooks(should_stop=lambda: False))  # nothing to wait: returns
