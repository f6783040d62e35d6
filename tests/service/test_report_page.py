"""The upgrade report as a page: rendered by headless Chromium, it has no errors, every plot
decodes, the verdict and every alternative are on it, and it loads nothing from elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.upgrades.report_html import measured_meanings, with_ids
from tests.chromium import render
from tests.service.conftest import problem

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/wordnet_small.npz"
OLD, NEW = "all-MiniLM-L6-v2", "all-mpnet-base-v2"


def upgrade_with_queries(client: TestClient, method: str, params: dict) -> dict:
    """Glosses (old model) as the gallery, the new model's glosses as the dataset, and a query
    log of lemmas by both models, each relevant to its own synset's gloss."""
    data = np.load(FIXTURE)
    ids = [str(s) for s in data["synset_id"]]
    gallery = client.post(
        "/v1/galleries", json={"name": "glosses", "dim": 384, "model_name": OLD, "metric": "cosine"}
    ).json()
    stored = client.post(
        f"/v1/galleries/{gallery['id']}/vectors",
        json={
            "ids": ids,
            "vectors": data[f"gloss.{OLD}"].astype(np.float32).tolist(),
            "labels": [str(x) for x in data["label"]],
        },
    )
    assert stored.status_code == 200, stored.text
    dataset = client.post("/v1/datasets", json={"name": "new", "gallery_id": gallery["id"]}).json()
    items = client.post(
        f"/v1/datasets/{dataset['id']}/items",
        json={"ids": ids, "features": data[f"gloss.{NEW}"].astype(np.float32).tolist()},
    )
    assert items.status_code == 200, items.text
    queries = client.post(
        f"/v1/datasets/{dataset['id']}/queries",
        json={
            "ids": [f"q-{i}" for i in ids],
            "features": data[f"lemma.{NEW}"].astype(np.float32).tolist(),
            "old_vectors": data[f"lemma.{OLD}"].astype(np.float32).tolist(),
            "relevant_ids": [[i] for i in ids],
        },
    )
    assert queries.status_code == 200, queries.text
    job = client.post(
        "/v1/upgrades", json={"dataset_id": dataset["id"], "method": method, "params": params}
    )
    assert job.status_code == 202, job.text
    done = client.get(f"/v1/upgrades/{job.json()['id']}").json()
    assert done["status"] == "succeeded", done
    return done


@pytest.mark.slow
def test_auto_report_page_reads_in_chromium(client: TestClient, tmp_path: Path) -> None:
    job = upgrade_with_queries(client, "auto", {"epochs": 3, "hidden_dim": 0, "trials": 1})
    page = client.get(f"/v1/upgrades/{job['id']}/report.html")
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    # Self-contained: no script, and nothing fetched from anywhere (images are data URIs).
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    seen = render(html, tmp_path, screenshot=tmp_path / "report.png")
    assert seen["errors"] == []
    report = job["report"]
    views = report["views"]
    # One plot per view, the training loss of the served model and the calibration (labels).
    assert report["calibration"]["source"] == "knn" and report["calibration"]["bins"]
    assert seen["images"] >= len(views) + 2
    assert "Uncertainty calibration" in seen["text"]
    assert seen["decoded"] == seen["images"]
    text = seen["text"]
    assert "Verdict" in text and report["recommendation"]["why"] in text
    # The verdict comes first, with the next step, before the facts and figures.
    step = with_ids(report["recommendation"]["next_step"], job)
    assert "Next step: " + step in text
    over_http = report["recommendation"]["next_step_http"]
    assert over_http is None or "over HTTP: " + with_ids(over_http, job) in text
    # Nothing wider than the window: wide tables scroll in their own box.
    assert seen["width"] <= seen["viewport"] == 1280
    assert text.index("Verdict") < text.index("method requested")
    for name in ("stay", "reindex", "procrustes", report["chosen_method"]):
        assert name in text
    for candidate in report["candidates"]:
        assert candidate["name"] in text
    glossary = measured_meanings(report["metric_meanings"], report["metrics"])
    for view in glossary.values():
        for meaning in view.values() if isinstance(view, dict) else [view]:
            assert meaning in text


def test_report_page_of_an_unfinished_upgrade_is_a_conflict(client: TestClient) -> None:
    from tests.service.test_upgrades_api import RecordingRunner, paired_setup

    state = client.app.state.service
    real, state.runner = state.runner, RecordingRunner()
    try:
        _, dataset_id = paired_setup(client)
        job = client.post("/v1/upgrades", json={"dataset_id": dataset_id, "method": "procrustes"})
        assert job.status_code == 202, job.text
        body = problem(client.get(f"/v1/upgrades/{job.json()['id']}/report.html"), 409)
        assert "queued" in body["detail"]
    finally:
        state.runner = real
    problem(client.get("/v1/upgrades/upg_missing/report.html"), 404)
