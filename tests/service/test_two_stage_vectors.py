"""The new vectors a two-stage search ranks by (``app.search.two_stage.NewVectors.stored``): the
model's in-memory copy of its re-embedded features, looked up by id through a sort kept with the
copy (issue 43, speed target). A search whose candidates are all embedded must pay nothing of
size O(gallery) for it — the same arrays come back while nothing was written — and every write
of the items (re-embedded, rewritten, deleted) must show in the next lookup.
"""

from __future__ import annotations

import numpy as np
from fastapi.testclient import TestClient

from app.galleries.models import Gallery
from app.migration import reembed
from app.migration.reembed import EmbeddedTexts, reembedded_features, store_embedded
from app.models.service import get_model
from app.search.two_stage import NewVectors
from app.vectors.storage import storage_for
from tests.service.test_backfill_api import N_GALLERY, upgraded, upload_reembedded
from tests.service.test_queries_api import NEW
from tests.service.test_two_stage_search import TEXTS, with_texts


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def lookup(client: TestClient, setup: dict, ids: list[str]) -> tuple[NewVectors, dict[str, int]]:
    """(the model's new vectors as a search gets them, item id → internal id)."""
    state = client.app.state.service
    with state.db.sessions() as session:
        try:
            gallery = session.get(Gallery, setup["gallery_id"])
            assert gallery is not None
            internal = storage_for(session, gallery).lookup(session, gallery, ids)
            vectors = NewVectors.stored(session, setup["gallery_id"], setup["model_id"])
            # The same lookups from the copy in its written order: the sort changes no answer.
            written = NewVectors.of(
                *reembedded_features(session, setup["gallery_id"], setup["model_id"])
            )
        finally:
            session.rollback()
    wanted = np.asarray([v for v, _ in internal.values()], dtype=np.int64)
    assert np.array_equal(vectors.positions(wanted), written.positions(wanted))
    return vectors, {item: v for item, (v, _) in internal.items()}


def row_of(vectors: NewVectors, vector_id: int) -> np.ndarray | None:
    at = int(vectors.positions(np.asarray([vector_id]))[0])
    return None if at < 0 else vectors.rows[at]


def test_the_copy_is_reused_until_a_write_and_every_write_shows(
    client: TestClient, wordnet_small: dict
) -> None:
    setup = upgraded(client, wordnet_small)
    gallery_id, model_id = setup["gallery_id"], setup["model_id"]
    ids = [str(i) for i in wordnet_small["synset_id"][:N_GALLERY]]
    features = wordnet_small[f"gloss.{NEW}"][:N_GALLERY]

    # Items 30–59 re-embedded in reverse order: the copy's written order is not the ids' order.
    stored = upload_reembedded(client, gallery_id, model_id, ids[59:29:-1], features[59:29:-1])
    assert stored.status_code == 200, stored.text
    first, internal = lookup(client, setup, ids)
    assert np.all(np.diff(first.ids) > 0) and first.ids.size == 30
    for n, item in enumerate(ids):
        row = row_of(first, internal[item])
        if 30 <= n < 60:
            assert row is not None and np.allclose(row, unit(features[n]), atol=1e-6)
        else:
            assert row is None

    # Nothing written: the same arrays, not a copy of them (a warm search pays nothing).
    again, _ = lookup(client, setup, ids)
    assert again.rows is first.rows and again.ids is first.ids and again.order is first.order

    # More items re-embedded, and item 30 re-embedded again with other features.
    stored = upload_reembedded(
        client, gallery_id, model_id, [*ids[:5], ids[30]], np.r_[features[:5], features[100:101]]
    )
    assert stored.status_code == 200, stored.text
    second, _ = lookup(client, setup, ids)
    assert second.rows is not first.rows and second.ids.size == 35
    assert all(row_of(second, internal[item]) is not None for item in ids[:5])
    assert np.allclose(row_of(second, internal[ids[30]]), unit(features[100]), atol=1e-6)

    # An item deleted: its re-embedded features go with it.
    deleted = client.request(
        "DELETE", f"/v1/galleries/{gallery_id}/vectors", json={"ids": [ids[31]]}
    )
    assert deleted.status_code == 200, deleted.text
    third, _ = lookup(client, setup, ids)
    assert third.ids.size == 34 and row_of(third, internal[ids[31]]) is None
    assert np.allclose(row_of(third, internal[ids[32]]), unit(features[32]), atol=1e-6)


def test_items_a_search_embeds_are_appended_to_the_copy_as_a_read_would_give(
    client: TestClient, wordnet_small: dict
) -> None:
    """``store_embedded`` (a two-stage search's lazy re-embed) appends what it stored to the
    cached copy in place rather than having the whole copy read again (O(gallery) per search
    that embeds); the copy it gives is the one a fresh read gives, and a copy a search already
    holds does not change."""
    setup = upgraded(client, wordnet_small)
    gallery_id, model_id = setup["gallery_id"], setup["model_id"]
    with_texts(client, wordnet_small, gallery_id)
    ids = [str(i) for i in wordnet_small["synset_id"][:N_GALLERY]]
    features = wordnet_small[f"gloss.{NEW}"][:N_GALLERY]
    glosses = [row["gloss"] for row in TEXTS[:N_GALLERY]]
    state = client.app.state.service

    def embedded(wanted: list[int], internal: dict[str, int]) -> int:
        """``wanted`` items stored as a search that embedded them stores them."""
        with state.db.sessions() as session:
            gallery = session.get(Gallery, gallery_id)
            assert gallery is not None
            return store_embedded(
                session,
                state.indexes,
                gallery,
                get_model(session, gallery.tenant_id, model_id),
                EmbeddedTexts(
                    {internal[ids[n]]: ids[n] for n in wanted},
                    {internal[ids[n]]: glosses[n] for n in wanted},
                    features[wanted] * 3.0,  # not unit: the copy holds unit rows
                ),
            )

    # From an empty copy (no dimension yet): items 0–4.
    empty, internal = lookup(client, setup, ids)
    assert empty.ids.size == 0
    assert embedded(list(range(5)), internal) == 5
    some, _ = lookup(client, setup, ids)
    assert some.ids.size == 5
    assert np.allclose(some.rows[some.order], unit(features[:5]), atol=1e-6)

    # Items 30–59 uploaded (the copy read again), then items 5–9 and 30 (re-embedded
    # already: left as it is) embedded by a search.
    stored = upload_reembedded(client, gallery_id, model_id, ids[59:29:-1], features[59:29:-1])
    assert stored.status_code == 200, stored.text
    first, _ = lookup(client, setup, ids)
    held = first.rows.copy()
    assert embedded([*range(5, 10), 30], internal) == 5
    second, _ = lookup(client, setup, ids)
    assert second.ids.size == 40 and np.shares_memory(second.rows, first.rows)
    assert np.array_equal(first.rows, held)  # the copy a search held is as it was
    for n in range(60):
        row = row_of(second, internal[ids[n]])
        if n < 10 or 30 <= n < 60:
            assert row is not None and np.allclose(row, unit(features[n]), atol=1e-6)
        else:
            assert row is None

    # The copy read afresh from the database holds the same rows for the same ids.
    reembed._features.clear()
    fresh, _ = lookup(client, setup, ids)
    assert not np.shares_memory(fresh.rows, second.rows)
    assert np.array_equal(fresh.ids, second.ids)
    assert np.allclose(fresh.rows[fresh.order], second.rows[second.order], atol=1e-6)
