"""Durability against ``kill -9``: a real uvicorn process (embedded mode: SQLite, its own data
directory) is killed mid-ingest at varied moments and restarted; every batch acknowledged with
200 must be back, found through the index, and the startup check must have repaired the index
files a kill left behind the database. The gallery keeps its vectors in segment files (the
embedded default): after every restart each file holds exactly the bytes its committed manifest
names (a batch appended but not committed when the kill came was cut off) and no vector is an
SQL row."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.common.service import RunningService, create_gallery, start_service

DIM = 8
BATCH = 40
# Flush intervals per round: long ones guarantee that a kill finds the file behind the database
# (the stale case); a short one lets kills land just before or after a background write.
FLUSH_INTERVALS = ["30", "0.3", "30", "0", "30"]
STARTUP = re.compile(r"startup check: (\d+) indexes, (\d+) rebuilt")


@dataclass
class Ingest:
    """Batches sent by one round's client: acknowledged ones and the one cut off by the kill."""

    acked: dict[str, np.ndarray] = field(default_factory=dict)
    in_flight: dict[str, np.ndarray] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def ingest_until_killed(service: RunningService, gallery_id: str, round_no: int) -> Ingest:
    """Upload batches back to back until the server stops answering (run in a thread)."""
    out = Ingest()
    rng = np.random.default_rng(round_no)
    with service.client(timeout=30) as client:
        for batch_no in range(10_000):
            ids = [f"r{round_no}-b{batch_no}-{i}" for i in range(BATCH)]
            vectors = rng.normal(size=(BATCH, DIM)).astype(np.float32)
            sent = dict(zip(ids, vectors, strict=True))
            out.in_flight = sent
            try:
                response = client.post(
                    f"/v1/galleries/{gallery_id}/vectors",
                    json={"ids": ids, "vectors": vectors.tolist()},
                )
            except httpx.HTTPError:
                return out
            if response.status_code != 200:
                out.failures.append(f"{response.status_code}: {response.text}")
                return out
            out.acked.update(sent)
            out.in_flight = {}
    return out


def nearest(client: httpx.Client, gallery_id: str, vectors: dict[str, np.ndarray]) -> list[str]:
    """The nearest stored id of each vector (its own id when stored: distance 0)."""
    found = []
    ids = list(vectors)
    for start in range(0, len(ids), 2000):
        chunk = np.stack([vectors[i] for i in ids[start : start + 2000]])
        response = client.post(
            f"/v1/galleries/{gallery_id}/search", json={"vectors": chunk.tolist(), "k": 1}
        )
        assert response.status_code == 200, response.text
        found += [row[0]["id"] if row else None for row in response.json()["results"]]
    return found


def kill_mid_ingest(
    service: RunningService, gallery_id: str, round_no: int, delay_s: float
) -> Ingest:
    """Ingest in a thread and ``kill -9`` the server after ``delay_s``; the client's record."""
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(ingest_until_killed, service, gallery_id, round_no)
        time.sleep(delay_s)
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
        ingest = running.result(timeout=60)
    assert ingest.failures == []
    return ingest


def check_all_or_nothing(
    client: httpx.Client,
    gallery_id: str,
    acked: dict[str, np.ndarray],
    cut_off: list[dict[str, np.ndarray]],
) -> None:
    """Each batch a kill cut off is stored entirely or not at all, and the gallery counts the
    acknowledged items plus the cut-off batches that were stored."""
    stored_cut_off = 0
    for batch in cut_off:
        hits = nearest(client, gallery_id, batch)
        assert hits == list(batch) or not set(hits) & set(batch), hits
        stored_cut_off += len(batch) if hits == list(batch) else 0
    count = client.get(f"/v1/galleries/{gallery_id}").json()["count"]
    assert count == len(acked) + stored_cut_off


def segment_files_match_manifest(data_dir: Path, gallery_id: str) -> None:
    with sqlite3.connect(data_dir / "nobackfill.db") as connection:
        storage, manifest = connection.execute(
            "SELECT vector_storage, vector_manifest FROM galleries WHERE id = ?", (gallery_id,)
        ).fetchone()
        rows = connection.execute("SELECT count(*) FROM gallery_vectors").fetchone()[0]
    assert storage == "segments" and rows == 0
    segments = json.loads(manifest)["segments"]
    directory = data_dir / "vectors" / gallery_id
    assert sorted(p.name for p in directory.iterdir()) == [s["name"] for s in segments]
    assert [(directory / s["name"]).stat().st_size for s in segments] == [
        s["bytes"] for s in segments
    ]


@pytest.mark.slow
def test_acknowledged_ingests_survive_kill_9(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {"NOBACKFILL_LOG_LEVEL": "info", "NOBACKFILL_INDEX_FLUSH_INTERVAL_S": FLUSH_INTERVALS[0]}
    service = start_service(data_dir, env, startup_timeout=120)
    gallery_id = create_gallery(
        service, {"name": "crash", "dim": DIM, "model_name": "m", "metric": "cosine"}
    )
    rng = np.random.default_rng(42)
    acked: dict[str, np.ndarray] = {}
    # Batches the kill cut off: each is stored entirely or not at all (no acknowledgement).
    cut_off: list[dict[str, np.ndarray]] = []
    rebuilt_after_long_interval = []
    for round_no, interval in enumerate(FLUSH_INTERVALS):
        ingest = kill_mid_ingest(service, gallery_id, round_no, float(rng.uniform(0.3, 1.5)))
        acked.update(ingest.acked)
        if ingest.in_flight:
            cut_off.append(ingest.in_flight)

        log_start = service.log_path.stat().st_size
        next_interval = FLUSH_INTERVALS[(round_no + 1) % len(FLUSH_INTERVALS)]
        env["NOBACKFILL_INDEX_FLUSH_INTERVAL_S"] = next_interval
        service = start_service(data_dir, env, startup_timeout=120)
        log = service.log_path.read_text()[log_start:]
        segment_files_match_manifest(data_dir, gallery_id)
        startup = STARTUP.findall(log)
        assert startup and startup[-1][0] == "1", log
        if interval == "30" and ingest.acked:
            rebuilt_after_long_interval.append(startup[-1][1] == "1")
            assert "no index file for the committed version" in log, log

        with service.client(timeout=120) as client:
            assert nearest(client, gallery_id, acked) == list(acked), f"round {round_no}"
            check_all_or_nothing(client, gallery_id, acked, cut_off)

    service.stop()
    assert len(acked) >= 4 * BATCH, "too few acknowledged batches to test anything"
    assert rebuilt_after_long_interval and all(rebuilt_after_long_interval)
