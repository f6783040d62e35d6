"""Issue 42 item 6 in the service: a transition search merges its two lists with what the
gallery's click log says of the re-embedded set (app.migration.membership), on real WordNet
vectors, both databases."""

from __future__ import annotations

import numpy as np
from fastapi.testclient import TestClient

from tests.service.test_backfill_api import N_GALLERY, _transition, reembed, upgraded
from tests.service.test_queries_api import NEW, OLD

QUERIES = 60


def _new_hits(results: list[list[dict]]) -> int:
    return sum(h["space"] == "new" for hits in results for h in hits)


def test_a_click_log_on_the_reembedded_set_lifts_it_and_the_ends_stay_exact(
    client: TestClient, wordnet_small
) -> None:
    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}"
    ids = wordnet_small["synset_id"][:N_GALLERY].tolist()
    new_q = wordnet_small[f"lemma.{NEW}"][:QUERIES]
    old_q = wordnet_small[f"lemma.{OLD}"][:QUERIES]
    hot = ids[: N_GALLERY // 10]
    assert reembed(client, setup, wordnet_small, hot).status_code == 200
    before = _transition(client, url, setup["model_id"], new_q, old_q).json()["results"]

    # Clicks that repeat on the re-embedded items: R holds what users want.
    counts = [8] * len(hot) + [1] * 20
    clicked = hot + ids[200:220]
    sent = client.post(f"{url}/access", json={"ids": clicked, "counts": counts})
    assert sent.status_code == 200, sent.text
    lifted = _transition(client, url, setup["model_id"], new_q, old_q).json()["results"]
    assert _new_hits(lifted) > _new_hits(before), (_new_hits(lifted), _new_hits(before))
    for hits in lifted:
        assert len(hits) == 10 and len({h["id"] for h in hits}) == 10
        # The re-embedded list's own order is kept: its hits in the order of their cosines.
        new = [h["distance"] for h in hits if h["space"] == "new"]
        assert new == sorted(new)

    # A log on other items only lowers R: fewer re-embedded hits than with no log at all.
    other = client.post(f"{url}/access", json={"ids": ids[300:340], "counts": [200] * 40})
    assert other.status_code == 200, other.text
    lowered = _transition(client, url, setup["model_id"], new_q, old_q).json()["results"]
    assert _new_hits(lowered) < _new_hits(before), (_new_hits(lowered), _new_hits(before))

    # Everything re-embedded: the reindex exactly, whatever the log.
    assert reembed(client, setup, wordnet_small, ids).status_code == 200
    full = _transition(client, url, setup["model_id"], new_q, old_q).json()["results"]
    docs = wordnet_small[f"gloss.{NEW}"][:N_GALLERY]
    docs = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    cos = (new_q / np.linalg.norm(new_q, axis=1, keepdims=True)) @ docs.T
    for q, hits in enumerate(full):
        assert [h["id"] for h in hits] == [ids[i] for i in np.argsort(-cos[q])[:10]]
