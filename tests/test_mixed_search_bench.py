"""bench.perf.mixed_search's --quick path on a tiny gallery of real fixture rows: every engine
timed, and what it times is the right search (no speed is asserted: the benchmark measures it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import bench.perf.mixed_search
from bench.common.tiled import WordNetRows

MINILM, MPNET = "all-MiniLM-L6-v2", "all-mpnet-base-v2"


@pytest.fixture
def fixture_rows(wordnet_small: dict, monkeypatch) -> WordNetRows:
    """The 800 fixture synsets' gloss and lemma rows in place of the shared data's 48,000."""
    rows = WordNetRows(
        old=np.concatenate([wordnet_small[f"{f}.{MINILM}"] for f in ("gloss", "lemma")]),
        new=np.concatenate([wordnet_small[f"{f}.{MPNET}"] for f in ("gloss", "lemma")]),
    )
    monkeypatch.setattr(bench.perf.mixed_search, "wordnet_rows", lambda with_new=True: rows)
    return rows


def test_mixed_search_benchmark_runs(fixture_rows: WordNetRows, tmp_path: Path) -> None:
    out = tmp_path / "mixed.json"
    bench.perf.mixed_search.main(
        ["--quick", "--sizes", "3000", "--batches", "1", "8", "--rounds", "2", "--out", str(out)]
    )
    result = json.loads(out.read_text())
    assert result["k"] == 10 and result["load_start"] and result["load_end"]
    size = result["sizes"][0]
    assert size["size"] == 3000 and size["reembedded"] == 750
    assert set(size["batches"]) == {"1", "8"}
    for entry in size["batches"].values():
        for name in bench.perf.mixed_search.ENGINES:
            assert entry[name]["calls"] == 2
            assert all(
                math.isfinite(entry[name][f]) and entry[name][f] > 0
                for f in ("median_ms", "p90_ms")
            )
        for name in bench.perf.mixed_search.COMPARED:
            assert math.isfinite(entry[f"{name}_vs_plain"]) and entry[f"{name}_vs_plain"] > 0
        checks = entry["checks"]
        # Nothing re-embedded: the transition search is the old model's own search, id for id.
        assert checks["transition_at_0_ids_equal_plain"] is True
        assert checks["transition_at_0_all_old"] is True
        assert checks["every_row_has_k_hits"] is True
        # The mixed engines do search the re-embedded items natively (not a silent fallback).
        assert checks["mixed_new_share"] > 0 and checks["transition_new_share"] > 0
