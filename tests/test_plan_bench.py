"""bench.perf.backfill_plan end to end on a small gallery, so that the script keeps running and
the plan it times really runs every step (no speed is asserted: the benchmark measures that)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bench.perf.backfill_plan as bench

OLD, NEW = "all-MiniLM-L6-v2", "all-mpnet-base-v2"


@pytest.mark.slow
def test_backfill_plan_benchmark_runs_every_signal(tmp_path: Path, wordnet_small: dict) -> None:
    arrays = {
        f"{field}.{model}": np.asarray(wordnet_small[f"{field}.{model}"], dtype=np.float32)
        for field in ("gloss", "lemma")
        for model in (OLD, NEW)
    }
    out = tmp_path / "plan.json"
    result = bench.main(
        [
            "--quick",
            "--items",
            "12000",
            "--counts",
            "20000",
            "--searches",
            "256",
            "--repeats",
            "2",
            "--out",
            str(out),
        ],
        arrays=arrays,
    )
    entry = result["databases"]["sqlite"]
    assert len(entry["plan_s"]) == 2 and all(t > 0 for t in entry["plan_s"])
    # 10 % of 12,000 items, of which 1 % (120) are re-embedded already.
    assert entry["reembedded"] == 120 and entry["total"] == 12000
    assert entry["planned_ids"] == 1200 - 120
    # Every traffic signal was read and validated: counts, the tally, the neighbourhood.
    assert "access_counts" in entry["signals"] and entry["splits"] == 4
    assert entry["returned_items"] > 0
    assert any("neighbourhood" in c for c in entry["candidates"])
    assert any("returned" in c for c in entry["candidates"])
    assert json.loads(out.read_text())["items"] == 12000
    assert "| sqlite |" in bench.render_markdown(result)
