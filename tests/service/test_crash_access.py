"""Access counts are acknowledged writes too: a real server is killed with SIGKILL while a client
adds counts batch after batch; after each restart the gallery's counts are exactly the sum of the
acknowledged batches, plus the batch the kill cut off entirely or not at all."""

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

ITEMS, BATCH, ROUNDS = 2000, 500, 3


def prepare(service: RunningService) -> tuple[str, list[str]]:
    ids = [f"item-{i}" for i in range(ITEMS)]
    vectors = np.random.default_rng(0).normal(size=(ITEMS, 4)).astype(np.float32)
    with service.client(timeout=120) as client:
        gallery = client.post(
            "/v1/galleries", json={"name": "g", "dim": 4, "model_name": "m", "metric": "cosine"}
        ).json()["id"]
        stored = client.post(
            f"/v1/galleries/{gallery}/vectors", json={"ids": ids, "vectors": vectors.tolist()}
        )
        assert stored.status_code == 200, stored.text
    return gallery, ids


def batch(n: int, ids: list[str]) -> tuple[list[str], list[int]]:
    """The n-th batch: BATCH random items (repeats allowed, summed by the server), counts 1–3."""
    rng = np.random.default_rng([5, n])
    return [ids[i] for i in rng.integers(0, ITEMS, BATCH)], rng.integers(1, 4, BATCH).tolist()


def count_until_killed(
    service: RunningService, gallery: str, ids: list[str], first: int
) -> tuple[list[int], int | None]:
    """Send batches first, first + 1, … until the server dies: (acknowledged, cut off)."""
    acked: list[int] = []
    with service.client(timeout=30) as client:
        n = first
        while True:
            names, counts = batch(n, ids)
            try:
                response = client.post(
                    f"/v1/galleries/{gallery}/access", json={"ids": names, "counts": counts}
                )
            except httpx.HTTPError:
                return acked, n
            assert response.status_code == 200, response.text
            acked.append(n)
            n += 1


def expected_counts(batches: list[int], ids: list[str]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for n in batches:
        for name, count in zip(*batch(n, ids), strict=True):
            totals[name] = totals.get(name, 0) + count
    return totals


def stored_counts(client: httpx.Client, gallery: str) -> dict[str, int]:
    out: dict[str, int] = {}
    token = None
    while True:
        params = {"limit": 200, **({"page_token": token} if token else {})}
        page = client.get(f"/v1/galleries/{gallery}/access", params=params).json()
        out.update((item["id"], item["count"]) for item in page["items"])
        token = page.get("next_page_token")
        if token is None:
            return out


@pytest.mark.slow
def test_acknowledged_access_counts_survive_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {"NOBACKFILL_LOG_LEVEL": "info"}
    service = start_service(data_dir, env, startup_timeout=120)
    gallery, ids = prepare(service)
    rng = np.random.default_rng(2)
    acked: list[int] = []
    cut_off: list[int] = []
    for _ in range(ROUNDS):
        first = max(acked + cut_off, default=-1) + 1
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(count_until_killed, service, gallery, ids, first)
            time.sleep(float(rng.uniform(0.5, 1.5)))
            os.kill(service.process.pid, signal.SIGKILL)
            service.process.wait()
            done, in_flight = running.result(timeout=60)
        acked += done
        if in_flight is not None:
            cut_off.append(in_flight)
        service = start_service(data_dir, env, startup_timeout=120)
        with service.client(timeout=120) as client:
            stored = stored_counts(client, gallery)
        # Each cut-off batch counted entirely or not at all: one of the combinations matches.
        combinations = [
            [c for bit, c in enumerate(cut_off) if mask >> bit & 1]
            for mask in range(2 ** len(cut_off))
        ]
        matches = [c for c in combinations if expected_counts(acked + c, ids) == stored]
        assert matches, (len(acked), cut_off)
    service.stop()
    assert len(acked) >= 2, "too few acknowledged batches to test anything"
