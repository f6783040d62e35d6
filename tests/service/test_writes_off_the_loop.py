"""A write waiting for the database never stops the server: uploads run their database work in
the thread pool, not on the event loop, so while one waits for a lock every other request of
every tenant is still answered (it once blocked the loop, and a delete that held the lock then
waited on the loop for its own cleanup: both stalled for the busy timeout)."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from bench.common.service import start_service


@pytest.mark.parametrize("endpoint", ["vectors", "items", "queries"])
def test_an_upload_waiting_for_the_write_lock_leaves_the_server_answering(
    tmp_path: Path, endpoint: str
) -> None:
    data_dir = tmp_path / "data"
    service = start_service(data_dir, {"NOBACKFILL_SQLITE_BUSY_TIMEOUT_MS": "20000"}, 120)
    try:
        with service.client(timeout=60) as client:
            gallery = client.post(
                "/v1/galleries", json={"name": "g", "dim": 2, "model_name": "m", "metric": "cosine"}
            ).json()["id"]
            stored = client.post(
                f"/v1/galleries/{gallery}/vectors", json={"ids": ["a"], "vectors": [[1.0, 0.0]]}
            )
            assert stored.status_code == 200, stored.text
            dataset = client.post("/v1/datasets", json={"name": "d", "gallery_id": gallery})
            dataset_id = dataset.json()["id"]
        url, body = {
            "vectors": (f"/v1/galleries/{gallery}/vectors", {"ids": ["b"], "vectors": [[0, 1.0]]}),
            "items": (f"/v1/datasets/{dataset_id}/items", {"ids": ["a"], "features": [[1.0]]}),
            "queries": (
                f"/v1/datasets/{dataset_id}/queries",
                {"ids": ["q"], "features": [[1.0]], "relevant_ids": [["a"]]},
            ),
        }[endpoint]
        # Another process's writer holds the database's write lock.
        holder = sqlite3.connect(data_dir / "nobackfill.db", isolation_level=None, timeout=30)
        holder.execute("BEGIN IMMEDIATE")
        with ThreadPoolExecutor(1) as pool, service.client(timeout=60) as client:
            waiting = pool.submit(client.post, url, json=body)
            time.sleep(1.0)
            assert not waiting.done()  # it waits for the lock, as it should
            with service.client(timeout=5) as other:
                tic = time.monotonic()
                try:
                    answered = other.get(f"/v1/galleries/{gallery}")
                except httpx.TimeoutException:
                    pytest.fail("the server stopped answering while an upload waited for a lock")
                assert answered.status_code == 200
                assert time.monotonic() - tic < 2.0
            holder.execute("ROLLBACK")
            assert waiting.result(timeout=60).status_code == 200
        holder.close()
    finally:
        service.stop()
