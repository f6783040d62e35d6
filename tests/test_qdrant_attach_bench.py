"""bench.perf.qdrant_attach --quick on the 800-synset fixture, so that the script keeps running and
its equality and no-copy figures are computed (no speed is asserted: the benchmark measures that)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bench.perf.qdrant_attach as bench

OLD, NEW = "all-MiniLM-L6-v2", "all-mpnet-base-v2"


@pytest.fixture
def arrays(wordnet_small: dict) -> dict[str, np.ndarray]:
    return {
        f"{field}.{model}": np.asarray(wordnet_small[f"{field}.{model}"], dtype=np.float32)
        for field in ("gloss", "lemma")
        for model in (OLD, NEW)
    }


@pytest.mark.slow
def test_qdrant_attach_benchmark_computes_its_figures(tmp_path: Path, arrays: dict) -> None:
    out = tmp_path / "qdrant.json"
    result = bench.main(["--quick", "--out", str(out)], arrays=arrays)
    assert json.loads(out.read_text())["run"]["equal"] == result["run"]["equal"]
    run = result["run"]
    assert run["synsets"] == 800 and run["queries"] == 200 and run["reembedded"] == 80
    # The same vectors, the same model: the attached collection answers as the copied gallery.
    assert set(run["equal"]) == set(bench.KINDS)
    assert all(share >= 0.99 for share in run["equal"].values()), run["equal"]
    assert all(full == 1.0 for full in run["full_rows"].values())
    # No copy: the attach reads ids only; the upgrade reads its paired items' vectors, then every
    # item's once more as the held-out search's gallery (issue 44 item 2) — read, not copied.
    reads = run["rows_read"]
    assert reads.get("attach.vectors", 0) == 0 and reads["attach.ids"] == 800
    assert run["paired"] < reads["upgrade.vectors"] <= 800 + run["paired"]
    footprint = run["footprint"]
    assert (
        footprint["attached"]["store_bytes"] - footprint["started"]["store_bytes"]
        < (run["old_vector_bytes"])
    )
    for entry in run["speed"]:
        assert entry["batch"] in (1, 256) and entry["ratio_old"] > 0 and entry["ratio_bridged"] > 0


@pytest.mark.slow
def test_qdrant_attach_scale_run_copies_no_vector(tmp_path: Path, arrays: dict) -> None:
    out = tmp_path / "scale.json"
    run = bench.main(["--scale", "1500", "--no-markdown", "--out", str(out)], arrays=arrays)["run"]
    assert run["count"] == 1500 and run["paired"] == 400
    reads = run["rows_read"]
    assert reads.get("attach.vectors", 0) == 0 and reads["attach.ids"] == 1500
    # Read, not copied: the paired items, then every item once as the held-out search's gallery.
    assert run["paired"] < reads["upgrade.vectors"] <= run["count"] + run["paired"]
    footprint = run["footprint"]
    grew = footprint["attached"]["store_bytes"] - footprint["started"]["store_bytes"]
    assert grew < run["old_vector_bytes"] / 10
