"""Issue 25, item 3: a gallery shows, per model, how far its migration has got — items
re-embedded, the share of the counted traffic they cover, and the expected quality of the search
now and one plan step further (from the model's stored backfill fit, never fitted by a GET)."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.client.commands import describe_gallery
from app.migration.progress import PROGRESS_STEP
from tests.service.test_backfill_api import N_GALLERY, reembed, upgraded


def _curve_at(curve: list[dict], metric: str, fraction: float) -> float:
    points = sorted((p["fraction"], p["value"]) for p in curve if p["metric"] == metric)
    xs, ys = zip(*points, strict=True)
    return float(np.interp(fraction, xs, ys))


def test_progress_shows_traffic_covered_and_expected_quality(
    client: TestClient, wordnet_small
) -> None:
    setup = upgraded(client, wordnet_small)
    url = f"/v1/galleries/{setup['gallery_id']}"
    model = setup["model_id"]
    items = wordnet_small["synset_id"][:N_GALLERY].tolist()
    counted = items[:4]
    uploaded = client.post(f"{url}/access", json={"ids": counted, "counts": [30, 10, 5, 5]})
    assert uploaded.status_code == 200, uploaded.text
    # Re-embed two counted items (30 + 10 of 50 clicks) and three never clicked.
    chosen = counted[:2] + items[10:13]
    assert reembed(client, setup, wordnet_small, chosen).status_code == 200
    before_fit = client.get(url).json()["reembedded"]
    assert before_fit[0]["reembedded"] == 5
    assert before_fit[0]["traffic_covered"] == pytest.approx(40 / 50)
    # No fit stored yet: a GET does not fit one (minutes on a large upgrade), it says so.
    assert before_fit[0]["expected"] is None

    plan = client.post(f"{url}/backfill-plan", json={"model_id": model, "count": 5}).json()
    progress = client.get(url).json()["reembedded"][0]
    fraction = progress["fraction"]
    assert fraction == pytest.approx(5 / N_GALLERY)
    expected = progress["expected"]
    curve = plan["transition_expected"] or plan["expected"]
    search = "transition" if plan["transition_expected"] else "mixed"
    assert expected["search"] == search and expected["view"] == plan["view"]
    metric = expected["metric"]
    assert expected["now"] == pytest.approx(_curve_at(curve, metric, fraction))
    step = expected["next"]
    assert step["fraction"] == pytest.approx(min(1.0, fraction + PROGRESS_STEP))
    assert step["value"] == pytest.approx(_curve_at(curve, metric, step["fraction"]))
    text = describe_gallery(client.get(url).json())
    assert "80% of counted traffic" in text and f"{metric} now {expected['now']:.3f}" in text


def test_progress_without_counts_says_no_traffic(client: TestClient, wordnet_small) -> None:
    setup = upgraded(client, wordnet_small)
    items = wordnet_small["synset_id"][:N_GALLERY].tolist()
    assert reembed(client, setup, wordnet_small, items[:3]).status_code == 200
    progress = client.get(f"/v1/galleries/{setup['gallery_id']}").json()["reembedded"][0]
    assert progress["traffic_covered"] is None
    assert "counted traffic" not in describe_gallery(
        client.get(f"/v1/galleries/{setup['gallery_id']}").json()
    )
