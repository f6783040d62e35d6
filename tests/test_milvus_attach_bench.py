"""bench.perf.milvus_attach on the 800-synset fixture tiled to 3,000 points, so that the script
keeps running and its no-copy figures are computed (the 1M-point figures are the benchmark's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bench.perf.milvus_attach as bench

OLD, NEW = "all-MiniLM-L6-v2", "all-mpnet-base-v2"


@pytest.mark.slow
def test_milvus_attach_benchmark_computes_its_no_copy_figures(
    tmp_path: Path, wordnet_small: dict
) -> None:
    arrays = {
        f"{field}.{model}": np.asarray(wordnet_small[f"{field}.{model}"], dtype=np.float32)
        for field in ("gloss", "lemma")
        for model in (OLD, NEW)
    }
    out = tmp_path / "milvus.json"
    result = bench.main(["--points", "3000", "--no-markdown", "--out", str(out)], arrays=arrays)
    run = json.loads(out.read_text())["run"]
    assert run == json.loads(json.dumps(result["run"]))
    assert run["count"] == 3000 and run["paired"] == 400
    # The attach reads no row (INT64 keys 0… are their own internal ids); the upgrade reads its
    # paired items' vectors, then every item's once more as the held-out search's gallery (the
    # report's figures search the whole gallery, issue 44 item 2) — read, not copied (the
    # store's footprint below).
    reads = run["rows_read"]
    assert reads.get("attach.vectors", 0) == 0 and reads.get("attach.ids", 0) == 0
    assert run["paired"] < reads["upgrade.vectors"] <= run["count"] + run["paired"]
    footprint = run["footprint"]
    grew = footprint["attached"]["store_bytes"] - footprint["started"]["store_bytes"]
    assert grew < run["old_vector_bytes"] / 10, (grew, run["old_vector_bytes"])
    assert "no copy: met" in bench.render(result)
