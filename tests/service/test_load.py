"""bench.perf.load's quick path: searches and ingests run concurrently against a real server for a
short time without a single error, and the figures it reports are consistent."""

from __future__ import annotations

import json
from pathlib import Path

import bench.perf.load


def test_load_smoke(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    argv = ["--quick", "--duration", "3", "--rows", "500", "--out", str(out)]
    result = bench.perf.load.main(argv)
    search, ingest = result["results"]["search"], result["results"]["ingest"]
    errors = {name: r["first_errors"] for name, r in result["results"].items() if r["errors"]}
    assert not errors, (errors, result.get("server_log_tail"))
    assert search["requests"] > 0 and ingest["requests"] > 0
    assert result["final_count"] == 500 + ingest["rows"]
    assert 0 < search["p50_ms"] <= search["p99_ms"]
    assert json.loads(out.read_text())["results"] == result["results"]
