"""Issue 44 item 1 on real data: the default upgrade without a query log, searched as the README
says, is never below staying with the old model on R@10 beyond its interval.

The README's walk-through on the committed WordNet fixture (tests/fixtures/wordnet_small.npz:
old = MiniLM glosses, new = mpnet glosses): a gallery of every synset's old gloss, a dataset
pairing a seeded 60 % of them with their new glosses, no query log, ``POST /v1/upgrades`` with
the dataset alone (method ``auto``, every default). The held-out queries are the lemmas of the
other 40 % (never seen by the upgrade), each relevant to its own synset's gloss, against every
gloss of the gallery, with the gallery's labels (the README's walk-through uploads them: the
objective is then class search) or without. "As the README says": features alone, and when that
answer warns (a verdict other than ``bridge``, or a bridge judged on class search alone) the new
features with the old model's ``old_vectors`` (a transition search, exactly the old model's own
while nothing is re-embedded). Stay is the
old model's own search (``vectors``). The served search's R@10 may not fall below stay's by more
than two standard errors of the paired per-query difference.
"""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.service.test_queries_api import NEW, OLD, make_dataset, npy

PAIRED_SHARE = 0.6
K = 10

pytestmark = [
    pytest.mark.sqlite_only("the verdict and the search, not the SQL backend"),
    pytest.mark.faiss_only("the verdict and the search, not the vector engine"),
]


def _hits(answer) -> list[list[str]]:
    assert answer.status_code == 200, answer.text
    return [[h["id"] for h in row] for row in answer.json()["results"]]


def _recall_at_k(hits: list[list[str]], targets: list[str]) -> np.ndarray:
    return np.array([t in row[:K] for row, t in zip(hits, targets, strict=True)], dtype=float)


@pytest.mark.parametrize("labels", [False, True], ids=["no-labels", "labels"])
def test_the_default_upgrade_searched_as_the_readme_says_is_never_below_stay(
    client: TestClient, wordnet_small, labels: bool
) -> None:
    ids = wordnet_small["synset_id"]
    n = ids.size
    order = np.random.default_rng(44).permutation(n)
    paired, held = order[: round(PAIRED_SHARE * n)], order[round(PAIRED_SHARE * n) :]

    # The walk-through: a gallery of old vectors (labels as the README uploads them, or none),
    # a dataset of new features for 60 % of its items, and the upgrade with no method.
    gallery = client.post(
        "/v1/galleries",
        json={"name": "products", "dim": 384, "model_name": OLD, "metric": "cosine"},
    ).json()
    parts = {"ids": npy(ids), "vectors": npy(wordnet_small[f"gloss.{OLD}"])}
    if labels:
        parts["labels"] = npy(wordnet_small["label"])
    uploaded = client.post(f"/v1/galleries/{gallery['id']}/vectors", files=parts)
    assert uploaded.status_code == 200, uploaded.text
    dataset = make_dataset(client, name="mpnet", gallery_id=gallery["id"])
    items = client.post(
        f"/v1/datasets/{dataset['id']}/items",
        files={"ids": npy(ids[paired]), "features": npy(wordnet_small[f"gloss.{NEW}"][paired])},
    )
    assert items.status_code == 200, items.text
    created = client.post("/v1/upgrades", json={"dataset_id": dataset["id"]})
    assert created.status_code == 202, created.text
    job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    assert job["method"] == "auto"
    verdict = job["report"]["recommendation"]

    url = f"/v1/galleries/{gallery['id']}/search"
    new_q = wordnet_small[f"lemma.{NEW}"][held].tolist()
    old_q = wordnet_small[f"lemma.{OLD}"][held].tolist()
    targets = ids[held].tolist()
    stay = _hits(client.post(url, json={"vectors": old_q, "k": K}))
    served_body = {"model_id": job["model_id"], "features": new_q, "k": K}
    # The README: a features-only search answers with a warning naming old_vectors unless the
    # verdict is a bridge judged on queries; then send them too.
    features_only = client.post(url, json=served_body)
    warning = features_only.json().get("warning")
    if warning is not None:
        assert "old_vectors" in warning and "--old-queries" in warning, warning
        assert features_only.headers["X-Nobackfill-Warning"], features_only.headers
        served_body["old_vectors"] = old_q
    served = _hits(client.post(url, json=served_body))
    if labels and verdict["action"] == "bridge":
        # Judged on class search: the verdict says query search was not measured, and so
        # does every features-only search through it.
        assert verdict["metric"]["view"] == "class" and verdict["unmeasured"] == ["query"]
        assert "query → document search through the bridge is not measured" in verdict["why"]
        assert warning is not None and "judged on class search" in warning

    gain = _recall_at_k(served, targets) - _recall_at_k(stay, targets)
    se = gain.std(ddof=1) / np.sqrt(gain.size)
    assert gain.mean() >= -2 * se, (
        f"{verdict['action']}: served R@10 {_recall_at_k(served, targets).mean():.3f} below stay "
        f"{_recall_at_k(stay, targets).mean():.3f} (paired mean {gain.mean():+.3f} ± {se:.3f})"
    )
