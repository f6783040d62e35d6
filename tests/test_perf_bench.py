"""The performance benchmarks' --quick paths on tiny galleries of real fixture rows, so that the
scripts keep running (no timing is asserted: speed is measured by the benchmarks themselves)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import bench.perf.api_memory
import bench.perf.indexes
import bench.perf.ingest
import bench.perf.mixed_search
import bench.perf.search
import bench.perf.training
from bench.common.report import replace_section
from bench.common.tiled import WordNetRows, tiled

MINILM, MPNET = "all-MiniLM-L6-v2", "all-mpnet-base-v2"


@pytest.fixture
def fixture_rows(wordnet_small: dict, monkeypatch) -> WordNetRows:
    """The 800 fixture synsets' gloss and lemma rows in place of the shared data's 48,000."""
    rows = WordNetRows(
        old=np.concatenate([wordnet_small[f"{f}.{MINILM}"] for f in ("gloss", "lemma")]),
        new=np.concatenate([wordnet_small[f"{f}.{MPNET}"] for f in ("gloss", "lemma")]),
    )
    modules = (
        bench.perf.search,
        bench.perf.indexes,
        bench.perf.ingest,
        bench.perf.api_memory,
        bench.perf.mixed_search,
    )
    for module in modules:
        monkeypatch.setattr(module, "wordnet_rows", lambda with_new=True: rows)
    return rows


def test_tiled_rows_repeat_the_base_with_small_noise(fixture_rows: WordNetRows) -> None:
    rows = tiled(fixture_rows.old, 4000, noise=0.1, seed=1)
    base = fixture_rows.old[np.arange(4000) % len(fixture_rows.old)]
    offsets = np.linalg.norm(rows - base, axis=1)
    assert rows.shape == (4000, 384) and rows.dtype == np.float32
    assert 0.05 < offsets.mean() < 0.15 and len(np.unique(rows, axis=0)) == 4000


@pytest.mark.slow
def test_search_benchmark_runs(fixture_rows: WordNetRows, tmp_path: Path) -> None:
    out = tmp_path / "search.json"
    result = bench.perf.search.main(
        ["--quick", "--sizes", "3000", "--batches", "1", "4", "--no-markdown", "--out", str(out)]
    )
    entry = result["sizes"][0]["batches"]["4"]
    assert set(bench.perf.search.RAW + bench.perf.search.LIBRARY + bench.perf.search.HTTP) <= set(
        entry
    )
    assert entry["http_agrees"] is True
    assert json.loads(out.read_text())["sizes"][0]["size"] == 3000


def test_indexes_benchmark_runs(fixture_rows: WordNetRows, tmp_path: Path) -> None:
    result = bench.perf.indexes.main(
        [
            "--quick",
            "--sizes",
            "2000",
            "--radii",
            "2",
            "--no-markdown",
            "--out",
            str(tmp_path / "i"),
        ]
    )
    flat = result["cases"][0]["configs"]["flat (torch scan)"]
    assert flat["recall_at_10"] == 1.0  # exact scan + exact re-rank


@pytest.mark.slow
def test_ingest_benchmark_runs(fixture_rows: WordNetRows, tmp_path: Path) -> None:
    result = bench.perf.ingest.main(
        ["--rows", "2000", "--batch", "500", "--no-markdown", "--out", str(tmp_path / "ingest")]
    )
    assert set(result["paths"]) == set(bench.perf.ingest.PATHS)
    assert all(len(p["batch_ms"]) == 4 for p in result["paths"].values())


def test_training_epoch_times_skip_the_first_epoch(wordnet_small: dict) -> None:
    from bench.common.tiled import lift_points

    old = lift_points(wordnet_small[f"gloss.{MINILM}"][:200], bench.perf.training.EuclideanLift())
    labels = np.unique(wordnet_small["label"][:200], return_inverse=True)[1]
    times = bench.perf.training.epoch_times(
        "l2",
        wordnet_small[f"gloss.{MPNET}"][:200],
        old,
        labels,
        3,
        bench.perf.training.resolve_device("cpu"),
    )
    assert len(times) == 2 and all(t > 0 for t in times)


def test_sections_are_replaced_in_place(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    replace_section("bench.a", "A", "first", path)
    replace_section("bench.b", "B", "other", path)
    replace_section("bench.a", "A", "second", path)
    text = path.read_text()
    assert "second" in text and "first" not in text and "other" in text
    assert text.index("bench.a:start") < text.index("bench.b:start")


# The API-memory target, restated: Milvus's API-process growth ≤ 5 % of FAISS's.
MEMORY_FRACTION = 0.05


def check_memory_verdict(result: dict) -> None:
    """Each engine's growth is the least-squares slope of its steps (the first, warm-up size left
    out), and the verdict compares Milvus's with the fraction of FAISS's."""
    growth = {}
    for engine, run in result["engines"].items():
        rows = np.array([s["rows"] for s in run["steps"]], dtype=float)[1:]
        mib = np.array([s["api_mib"] for s in run["steps"]], dtype=float)[1:]
        slope = np.polyfit(rows, mib, 1)[0] * 100_000
        assert run["growth"]["api_mib_per_100k"] == pytest.approx(slope, abs=1e-9), engine
        growth[engine] = slope
    check = result["verdict"]
    assert check["met"] is bool(growth["milvus"] <= MEMORY_FRACTION * growth["faiss"])
    assert check["limit_mib_per_100k"] == pytest.approx(MEMORY_FRACTION * growth["faiss"])


def test_api_memory_benchmark_runs(fixture_rows: WordNetRows, tmp_path: Path) -> None:
    out = tmp_path / "api_memory.json"
    result = bench.perf.api_memory.main(["--quick", "--no-markdown", "--out", str(out)])
    sizes = sorted(bench.perf.api_memory.QUICK_SIZES)
    assert set(result["engines"]) == set(bench.perf.api_memory.ENGINES)
    for engine, run in result["engines"].items():
        assert [step["rows"] for step in run["steps"]] == sizes
        assert all(step["api_mib"] > 0 for step in run["steps"])
        # The Milvus server is a process of its own, measured apart from the API's.
        assert all(("milvus_mib" in step) == (engine == "milvus") for step in run["steps"])
        assert run["growth"]["api_mib_per_100k"] is not None
    check_memory_verdict(result)
    saved = json.loads(out.read_text())
    assert saved["sizes"] == sizes
    # A saved run republished: the same growth from its steps, the command line kept.
    again = bench.perf.api_memory.republish(out, no_markdown=True)
    assert again["command"] == saved["command"]
    for engine, run in again["engines"].items():
        assert run["growth"] == result["engines"][engine]["growth"]


def test_api_memory_growth_is_the_slope_and_the_verdict_compares_it() -> None:
    rows = [10_000, 50_000, 90_000, 130_000]
    per_row = np.array([2.0, 0.05])  # MiB per 100k rows: FAISS, Milvus
    base = 300.0
    # The first size is the warm-up: a one-off jump there does not count as growth.
    slopes = [
        bench.perf.api_memory.slope_per_100k(
            rows, [base - 50.0 * (r == rows[0]) + g * r / 100_000 for r in rows]
        )
        for g in per_row
    ]
    np.testing.assert_allclose(slopes, per_row)
    assert bench.perf.api_memory.slope_per_100k(rows[:2], [base, base]) is None
    # The slope's standard error: none on a straight line, some once the points scatter.
    line = [base + r / 100_000 for r in rows]
    assert bench.perf.api_memory.slope_error_per_100k(rows, line) < 1e-9
    scattered = [m + (20.0 if i % 2 else -20.0) for i, m in enumerate(line)]
    assert bench.perf.api_memory.slope_error_per_100k(rows, scattered) > 1.0
    assert bench.perf.api_memory.slope_error_per_100k(rows[:3], line[:3]) is None
    engines = {
        "faiss": {"growth": {"api_mib_per_100k": slopes[0]}},
        "milvus": {"growth": {"api_mib_per_100k": slopes[1]}},
    }
    check = bench.perf.api_memory.verdict({"engines": engines})
    assert check["met"] == (per_row[1] <= bench.perf.api_memory.TARGET_FRACTION * per_row[0])
    np.testing.assert_allclose(check["milvus_over_faiss"], per_row[1] / per_row[0])
    engines["milvus"]["growth"]["api_mib_per_100k"] = per_row[0]
    assert bench.perf.api_memory.verdict({"engines": engines})["met"] is False

    # The check of a run's verdict: on runs built from steps, and failing on a wrong verdict or a
    # growth that is not its steps' slope.
    assert bench.perf.api_memory.TARGET_FRACTION == MEMORY_FRACTION
    for milvus_growth, met in ((0.05, True), (0.5, False)):
        run = {"engines": {}}
        for engine, g in (("faiss", 2.0), ("milvus", milvus_growth)):
            steps = [{"rows": r, "api_mib": base + g * r / 100_000} for r in rows]
            run["engines"][engine] = {
                "steps": steps,
                "growth": bench.perf.api_memory.growth_of(steps),
            }
        run["verdict"] = bench.perf.api_memory.verdict(run)
        assert run["verdict"]["met"] is met
        check_memory_verdict(run)
        with pytest.raises(AssertionError):
            check_memory_verdict({**run, "verdict": {**run["verdict"], "met": not met}})
        run["engines"]["milvus"]["growth"]["api_mib_per_100k"] += 0.01
        with pytest.raises(AssertionError):
            check_memory_verdict(run)


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
