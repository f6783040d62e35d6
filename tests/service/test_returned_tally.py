"""The service's own tally of what its searches returned (issue 25, item 1): 1 / rank per hit,
kept in memory and written by a background thread, shown in the backfill plan, used only where
validation against access counts picks it, gone with its item and gallery, off with a setting."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.galleries.models import Gallery, ReturnedWeight
from app.migration.returned import rank_weights
from app.vectors.storage import storage_for
from tests.service.test_backfill_api import upgraded
from tests.service.test_galleries_api import make_gallery, seed_vectors
from tests.service.test_queries_api import OLD


def stored_weights(client: TestClient, gallery_id: str) -> dict[int, float]:
    with client.app.state.service.db.sessions() as session:
        rows = session.execute(
            select(ReturnedWeight.vector_id, ReturnedWeight.weight).where(
                ReturnedWeight.gallery_id == gallery_id
            )
        ).all()
    return {int(v): float(w) for v, w in rows}


def internal_ids(client: TestClient, gallery_id: str) -> dict[str, int]:
    with client.app.state.service.db.sessions() as session:
        gallery = session.get(Gallery, gallery_id)
        ids = [f"item-{n}" for n in range(50)]
        found = storage_for(session, gallery).lookup(session, gallery, ids)
    return {item: vector_id for item, (vector_id, _) in found.items()}


def search(client: TestClient, gallery_id: str, vectors: list[list[float]], k: int) -> Any:
    found = client.post(f"/v1/galleries/{gallery_id}/search", json={"vectors": vectors, "k": k})
    assert found.status_code == 200, found.text
    return found.json()["results"]


def test_rank_weights_sum_one_over_rank_per_item() -> None:
    ids = np.array([[4, 7, -1], [7, 4, 9]])
    distinct, weights = rank_weights(ids)
    assert distinct.tolist() == [4, 7, 9]
    assert weights.tolist() == [1.0 + 0.5, 0.5 + 1.0, 1.0 / 3.0]
    assert rank_weights(np.empty((0, 3), dtype=np.int64))[0].size == 0


def test_searches_are_tallied_by_rank_and_written_on_flush(
    make_client: Any,
) -> None:
    # flush_s large: nothing is written until a flush is asked for (the plan does), or the
    # service stops.
    client = make_client(search_returned_flush_s=3600.0)
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id, n=20)
    results = search(client, gallery_id, [vectors[3].tolist(), vectors[5].tolist()], k=3)
    tally = client.app.state.service.returned
    assert tally.pending(gallery_id) > 0
    assert stored_weights(client, gallery_id) == {}
    assert tally.flush(gallery_id) > 0
    names = internal_ids(client, gallery_id)
    expected: dict[int, float] = {}
    for hits in results:
        for rank, hit in enumerate(hits, start=1):
            vector_id = names[hit["id"]]
            expected[vector_id] = expected.get(vector_id, 0.0) + 1.0 / rank
    assert stored_weights(client, gallery_id) == expected
    # A second search adds to what is stored; stopping the service writes what is pending.
    search(client, gallery_id, [vectors[3].tolist()], k=1)
    client.__exit__(None, None, None)
    after = stored_weights(make_client(), gallery_id)
    top = names[results[0][0]["id"]]
    assert after[top] == expected[top] + 1.0


def test_the_tally_goes_with_its_item_and_gallery_and_is_off_by_setting(
    make_client: Any,
) -> None:
    client = make_client(search_returned_flush_s=0.0)  # 0: written by every search
    gallery_id = make_gallery(client)
    vectors = seed_vectors(client, gallery_id, n=10)
    search(client, gallery_id, [vectors[1].tolist()], k=10)
    names = internal_ids(client, gallery_id)
    assert len(stored_weights(client, gallery_id)) == 10
    deleted = client.request(
        "DELETE", f"/v1/galleries/{gallery_id}/vectors", json={"ids": ["item-1"]}
    )
    assert deleted.status_code == 200, deleted.text
    assert names["item-1"] not in stored_weights(client, gallery_id)
    assert len(stored_weights(client, gallery_id)) == 9
    # Pending entries of a gallery deleted before they are written are dropped, not an error.
    tally = client.app.state.service.returned
    tally.flush_s = 3600.0
    search(client, gallery_id, [vectors[2].tolist()], k=3)
    assert client.delete(f"/v1/galleries/{gallery_id}").status_code == 204
    assert tally.flush() == 0 and tally.pending(gallery_id) == 0
    assert stored_weights(client, gallery_id) == {}

    off = make_client(search_returned_tally=False, search_returned_flush_s=0.0)
    other = make_gallery(off, name="untallied")
    vectors = seed_vectors(off, other, n=5)
    search(off, other, [vectors[0].tolist()], k=5)
    assert stored_weights(off, other) == {}


def test_the_plan_reports_the_tally_and_uses_it_only_with_clicks_to_validate_it(
    client: TestClient, wordnet_small
) -> None:
    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}"
    model = setup["model_id"]
    before = client.post(f"{url}/backfill-plan", json={"model_id": model, "count": 10}).json()
    queries = np.asarray(wordnet_small[f"gloss.{OLD}"][:40], dtype=np.float64).tolist()
    search(client, setup["gallery_id"], queries, k=10)
    plan = client.post(f"{url}/backfill-plan", json={"model_id": model, "count": 10})
    assert plan.status_code == 200, plan.text
    plan = plan.json()
    returned = plan["search_returned"]
    assert returned["items"] >= 10 and returned["weight"] > 0
    assert returned["used"] is False and "no access counts" in returned["why"]
    # Unused, it changes nothing of the order.
    assert plan["ids"] == before["ids"]
    assert plan["signals"] == [plan["estimator"]]

    clicked = wordnet_small["synset_id"][:30].tolist()
    uploaded = client.post(f"{url}/access", json={"ids": clicked, "counts": [5] * 30})
    assert uploaded.status_code == 200, uploaded.text
    ranked = client.post(f"{url}/backfill-plan", json={"model_id": model, "count": 30}).json()
    model_report = ranked["access"]["model"]
    assert model_report["splits"] > 0
    names = [c["name"] for c in model_report["candidates"]]
    assert names[0] == "access_counts"
    assert any("search_returned" in n for n in names) and any("neighbourhood" in n for n in names)
    assert model_report["chosen"] in names
    assert ("search_returned" in ranked["signals"]) == ranked["search_returned"]["used"]
