"""bench.quality.two_stage_traffic: the lazy re-embed counted search by search, the Zipf stream,
and a seed on the committed fixture (what a search embeds never exceeds its depth; deeper
candidate lists, which contain the shallower ones, never embed less of the gallery)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.quality.querydoc import load_arrays
from bench.quality.two_stage_traffic import (
    CHECKPOINTS,
    render,
    run_seed,
    simulate,
    summarise,
    zipf_stream,
)


def test_simulate_counts_only_what_no_earlier_search_embedded() -> None:
    candidates = np.array([[0, 1], [1, 2], [3, 0]])
    assert simulate(candidates, np.array([0, 1, 0, 2, 1]), 4).tolist() == [2, 1, 0, 1, 0]


def test_zipf_stream_is_seeded_and_skewed() -> None:
    skewed = zipf_stream(1000, 1.0, 50_000, seed=3)
    assert np.array_equal(skewed, zipf_stream(1000, 1.0, 50_000, seed=3))
    assert not np.array_equal(skewed, zipf_stream(1000, 1.0, 50_000, seed=4))
    top = np.bincount(skewed, minlength=1000).max() / skewed.size
    harmonic = np.sum(1.0 / np.arange(1, 1001))
    assert top == pytest.approx(1 / harmonic, rel=0.1)  # p(rank 1) = 1 / H_1000
    uniform = np.bincount(zipf_stream(1000, 0.0, 50_000, seed=3), minlength=1000)
    assert uniform.max() / uniform.mean() < 1.6


def test_a_seed_on_the_fixture() -> None:
    run = run_seed(load_arrays(quick=True), seed=0, searches=1000)
    for traffic in run["traffic"].values():
        shares = [
            cell["gallery_share_after"][str(CHECKPOINTS[0])] for cell in traffic["depths"].values()
        ]
        assert shares == sorted(shares) and 0 < shares[0] <= shares[-1] <= 1
        for depth, cell in traffic["depths"].items():
            assert cell["embedded_per_search_first"] <= int(depth)
            assert cell["embedded_per_search_last"] <= cell["embedded_per_search_first"]
    # Skewed traffic asks fewer distinct queries than uniform traffic, so embeds less.
    uniform, skewed = run["traffic"]["0.0"], run["traffic"]["1.0"]
    assert skewed["distinct_queries"] < uniform["distinct_queries"]
    text = render(
        {
            "command": "c",
            "machine": {"cpu": "x", "cores": 2, "date": "d"},
            "minutes": 0.1,
            "searches": 1000,
            "gallery": 800,
            "runs": [run, run],
            "summary": summarise([run, run]),
        }
    )
    assert "skewed traffic (Zipf s = 1)" in text and "| 200 |" in text
