"""The in-memory copy of a gallery's re-embedded features (``app.migration.reembed``) follows
every write: a search after a write sees exactly what was committed — more items re-embedded, an
item's features rewritten, an item deleted and another re-embedded — whatever row ids the
database hands out (SQLite gives a new row the largest id in use + 1, so a deleted last row's id
comes back)."""

from __future__ import annotations

import numpy as np
from fastapi.testclient import TestClient

from tests.service.test_backfill_api import N_GALLERY, reembed, upgraded
from tests.service.test_queries_api import NEW, npy


def _first_hits(client: TestClient, url: str, model_id: str, queries: np.ndarray) -> list:
    """(id, space) of each query's best hit."""
    body = {"model_id": model_id, "features": queries.tolist(), "k": 5}
    answer = client.post(f"{url}/search", json=body)
    assert answer.status_code == 200, answer.text
    return [(hits[0]["id"], hits[0]["space"]) for hits in answer.json()["results"]]


def test_a_search_sees_every_write_to_the_re_embedded_items(
    client: TestClient, wordnet_small
) -> None:
    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}"
    model = setup["model_id"]
    ids = wordnet_small["synset_id"][:N_GALLERY].tolist()
    gloss = wordnet_small[f"gloss.{NEW}"][:N_GALLERY]
    assert reembed(client, setup, wordnet_small, ids[:50]).status_code == 200
    # A re-embedded item's own new features find it first, natively.
    assert _first_hits(client, url, model, gloss[[10, 20]]) == [
        (ids[10], "new"),
        (ids[20], "new"),
    ]
    probes = gloss[[60, 70]]
    assert all(space == "old" for _, space in _first_hits(client, url, model, probes))

    # More items re-embedded after a search: the next search scores them natively.
    assert reembed(client, setup, wordnet_small, ids[50:100]).status_code == 200
    assert _first_hits(client, url, model, probes) == [(ids[60], "new"), (ids[70], "new")]

    # A plain upload of a new item (PostgreSQL keeps the copy: the same rows; SQLite reads it
    # again): the answers stay those of the re-embedded items.
    extra = client.post(
        f"{url}/vectors", json={"ids": ["extra"], "vectors": [np.ones(384).tolist()]}
    )
    assert extra.status_code == 200, extra.text
    assert _first_hits(client, url, model, probes) == [(ids[60], "new"), (ids[70], "new")]

    # The last-stored item's features rewritten (its row deleted and inserted again: on SQLite
    # it gets the same row id, and the row count is unchanged): searches use the new features.
    rewritten = client.post(
        f"{url}/vectors",
        files={
            "ids": npy(np.array([ids[99]])),
            "features": npy(gloss[[250]]),
            "model_id": (None, f'"{model}"', "application/json"),
        },
    )
    assert rewritten.status_code == 200, rewritten.text
    assert _first_hits(client, url, model, gloss[[250]]) == [(ids[99], "new")]

    # The last-stored item deleted and another re-embedded (the same count, and on SQLite the
    # same largest row id): the deleted one is gone and the new one scored natively.
    deleted = client.request("DELETE", f"{url}/vectors", json={"ids": [ids[99]]})
    assert deleted.status_code == 200, deleted.text
    assert reembed(client, setup, wordnet_small, [ids[150]]).status_code == 200
    assert _first_hits(client, url, model, gloss[[150, 60]]) == [
        (ids[150], "new"),
        (ids[60], "new"),
    ]
    progress = client.get(url).json()["reembedded"]
    assert progress[0]["reembedded"] == 100
