"""bench.perf.access_upload's --quick path on a tiny gallery, so that the script keeps running
and its figures stay sane (no speed is asserted: the benchmark measures that)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import bench.perf.access_upload as bench


def test_zipf_rows_repeat_popular_items() -> None:
    rows, counts = bench.zipf_rows(1000, 5000, 1.1, seed=0)
    assert rows.shape == counts.shape == (5000,)
    assert rows.min() >= 0 and rows.max() < 1000 and counts.min() >= 1 and counts.max() <= 3
    # Skewed: the most frequent item is drawn far more often than a uniform draw's 5.
    assert np.bincount(rows).max() > 100 and len(np.unique(rows)) < 1000


def test_access_upload_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "access.json"
    result = bench.main(
        [
            "--quick",
            "--items",
            "2000",
            "--rows",
            "6000",
            "--batches",
            "1000",
            "3000",
            "--databases",
            "sqlite",
            "--profile-batches",
            "2",
            "--out",
            str(out),
        ]
    )
    entry = result["databases"]["sqlite"]
    # Both batch sizes uploaded every row (the run checks GET /access against the upload).
    assert entry["batches"]["1000"]["requests"] == 6 and entry["batches"]["3000"]["requests"] == 2
    assert all(b["counts_per_s"] > 0 for b in entry["batches"].values())
    phases = entry["phases"]
    assert phases["batch"] == 3000
    assert {"parse", "check", "idempotency", "lookup", "commit", "write"} <= set(phases["phases_s"])
    assert all(v >= 0 for v in phases["phases_s"].values())
    assert abs(sum(phases["phases_s"].values()) - phases["seconds_per_batch"]) < 1e-9
    assert json.loads(out.read_text())["items"] == 2000
