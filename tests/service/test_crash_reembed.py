"""Re-embedded items (partial backfill) are acknowledged writes too: a real server is killed with
SIGKILL while a client uploads re-embedded features batch after batch; after each restart every
acknowledged batch is there — counted per model, and left out of the backfill plan, which lists
only items not yet re-embedded — and the batch the kill cut off is stored entirely or not at
all."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.common.service import RunningService, start_service

OLD_DIM, NEW_DIM, ITEMS, BATCH, ROUNDS = 8, 6, 4000, 40, 3


def prepare(service: RunningService) -> tuple[str, str, np.ndarray, list[str]]:
    """A gallery, a dataset of new features for a tenth of it and a procrustes model."""
    rng = np.random.default_rng(0)
    ids = [f"item-{i}" for i in range(ITEMS)]
    old = rng.normal(size=(ITEMS, OLD_DIM)).astype(np.float32)
    new = np.tanh(old @ rng.normal(size=(OLD_DIM, NEW_DIM))).astype(np.float32)
    with service.client(timeout=120) as client:
        gallery = client.post(
            "/v1/galleries",
            json={"name": "g", "dim": OLD_DIM, "model_name": "m", "metric": "cosine"},
        ).json()["id"]
        for start in range(0, ITEMS, 2000):
            stop = start + 2000
            stored = client.post(
                f"/v1/galleries/{gallery}/vectors",
                json={"ids": ids[start:stop], "vectors": old[start:stop].tolist()},
            )
            assert stored.status_code == 200, stored.text
        dataset = client.post("/v1/datasets", json={"name": "d", "gallery_id": gallery}).json()[
            "id"
        ]
        items = client.post(
            f"/v1/datasets/{dataset}/items",
            json={"ids": ids[:400], "features": new[:400].tolist()},
        )
        assert items.status_code == 200, items.text
        job = client.post("/v1/upgrades", json={"dataset_id": dataset, "method": "procrustes"})
        assert job.status_code == 202, job.text
        deadline = time.monotonic() + 300
        while (state := client.get(f"/v1/upgrades/{job.json()['id']}").json())["status"] in (
            "queued",
            "running",
        ):
            assert time.monotonic() < deadline, state
            time.sleep(0.5)
        assert state["status"] == "succeeded", state
    return gallery, state["model_id"], new, ids


def reembed_until_killed(
    service: RunningService, gallery: str, model: str, batches: list[list[int]], new: np.ndarray
):
    acked: list[int] = []
    in_flight: list[int] = []
    with service.client(timeout=30) as client:
        for rows in batches:
            in_flight = rows
            try:
                response = client.post(
                    f"/v1/galleries/{gallery}/vectors",
                    json={
                        "ids": [f"item-{r}" for r in rows],
                        "features": new[rows].tolist(),
                        "model_id": model,
                    },
                )
            except httpx.HTTPError:
                return acked, in_flight
            assert response.status_code == 200, response.text
            acked += rows
            in_flight = []
    return acked, in_flight


def not_yet_reembedded(client: httpx.Client, gallery: str, model: str) -> set[int]:
    """Rows the backfill plan still lists: every item not re-embedded for ``model``."""
    response = client.post(
        f"/v1/galleries/{gallery}/backfill-plan", json={"model_id": model, "fraction": 1.0}
    )
    assert response.status_code == 200, response.text
    return {int(i.removeprefix("item-")) for i in response.json()["ids"]}


def reembedded_count(client: httpx.Client, gallery: str, model: str) -> int:
    progress = client.get(f"/v1/galleries/{gallery}").json()["reembedded"]
    return next((p["reembedded"] for p in progress if p["model_id"] == model), 0)


@pytest.mark.slow
def test_acknowledged_reembedded_features_survive_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {"NOBACKFILL_LOG_LEVEL": "info", "NOBACKFILL_INDEX_FLUSH_INTERVAL_S": "30"}
    service = start_service(data_dir, env, startup_timeout=120)
    gallery, model, new, _ = prepare(service)
    order = np.random.default_rng(1).permutation(np.arange(400, ITEMS)).tolist()
    batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
    rng = np.random.default_rng(2)
    acked: list[int] = []
    cut_off: list[list[int]] = []
    for _ in range(ROUNDS):
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(reembed_until_killed, service, gallery, model, batches, new)
            time.sleep(float(rng.uniform(0.5, 1.5)))
            os.kill(service.process.pid, signal.SIGKILL)
            service.process.wait()
            done, in_flight = running.result(timeout=60)
        sent = len(done) // BATCH + (1 if in_flight else 0)
        batches = batches[sent:]
        acked += done
        if in_flight:
            cut_off.append(in_flight)
        service = start_service(data_dir, env, startup_timeout=120)
        with service.client(timeout=120) as client:
            pending = not_yet_reembedded(client, gallery, model)
            assert not pending & set(acked)
            stored_cut_off = 0
            for batch in cut_off:
                left = pending & set(batch)
                assert left in (set(), set(batch)), sorted(left)
                stored_cut_off += 0 if left else len(batch)
            assert reembedded_count(client, gallery, model) == len(acked) + stored_cut_off
            assert len(pending) == ITEMS - len(acked) - stored_cut_off
    service.stop()
    assert len(acked) >= 2 * BATCH, "too few acknowledged batches to test anything"


def delete_until_killed(service: RunningService, model: str) -> list[int]:
    """DELETE the model (no cascade) again and again; the status of every answer received."""
    statuses: list[int] = []
    with service.client(timeout=30) as client:
        while True:
            try:
                statuses.append(client.delete(f"/v1/models/{model}").status_code)
            except httpx.HTTPError:
                return statuses
            time.sleep(0.02)


@pytest.mark.slow
def test_a_model_delete_never_drops_acknowledged_reembedded_items_across_kill_9(
    tmp_path: Path,
) -> None:
    """Uploads of re-embedded items race refused deletes of their model, then the server is
    killed; afterwards a cascaded delete is cut off by a kill. Every acknowledged batch survives
    every refused delete, and the cascaded one happened entirely or not at all."""
    data_dir = tmp_path / "data"
    env = {"NOBACKFILL_LOG_LEVEL": "info"}
    service = start_service(data_dir, env, startup_timeout=120)
    gallery, model, new, _ = prepare(service)
    order = np.random.default_rng(3).permutation(np.arange(400, ITEMS)).tolist()
    batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]
    first, in_flight = reembed_until_killed(service, gallery, model, batches[:1], new)
    assert len(first) == BATCH and not in_flight
    with ThreadPoolExecutor(2) as pool:
        uploads = pool.submit(reembed_until_killed, service, gallery, model, batches[1:], new)
        deletes = pool.submit(delete_until_killed, service, model)
        time.sleep(4.0)
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
        acked, cut_off = uploads.result(timeout=60)
        statuses = deletes.result(timeout=60)
    assert statuses and set(statuses) == {409}, statuses
    acked = first + acked

    service = start_service(data_dir, env, startup_timeout=120)
    with service.client(timeout=120) as client:
        assert client.get(f"/v1/models/{model}").status_code == 200
        pending = not_yet_reembedded(client, gallery, model)
        assert not pending & set(acked)
        stored = reembedded_count(client, gallery, model)
        assert stored in (len(acked), len(acked) + len(cut_off))
        # A cascaded delete, killed as soon as it is sent: all of it or none of it.
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(
                lambda: client.delete(f"/v1/models/{model}", params={"cascade": "true"})
            )
            time.sleep(float(np.random.default_rng(4).uniform(0.0, 0.05)))
            os.kill(service.process.pid, signal.SIGKILL)
            service.process.wait()
            try:
                answer = sent.result(timeout=60).status_code
            except httpx.HTTPError:
                answer = None
    service = start_service(data_dir, env, startup_timeout=120)
    with service.client(timeout=120) as client:
        present = client.get(f"/v1/models/{model}").status_code
        assert answer in (None, 200) and (answer != 200 or present == 404)
        progress = client.get(f"/v1/galleries/{gallery}").json()
        assert progress["count"] == ITEMS  # the old vectors are never part of the cascade
        if present == 200:
            assert reembedded_count(client, gallery, model) == stored
        else:
            assert present == 404 and progress["reembedded"] == []
    service.stop()
