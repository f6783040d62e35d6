"""bench.perf.milvus_server (issue 46 item 4): each stage's quick path against the tests' real
Milvus server (``tests/service/milvus_server.py``), and the sections' verdicts — "met" only when
a figure's interval clears its target, "missed by" only when the whole interval misses it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from app.ml.upgrade.data import MAX_DISTRACTORS
from bench.common.sections import SERVER_SECTIONS
from bench.common.stats import t_interval
from bench.perf import milvus_server as bench
from bench.perf.milvus_server_report import (
    SECTIONS,
    at_least,
    at_most,
    paired_difference,
    render_api_memory,
    render_attach,
    render_bridged,
    slope_interval,
    wilson,
    within,
)
from tests.bench_facts import MACHINE
from tests.service.milvus_server import milvus_server_uri  # noqa: F401  (the fixture)

OLD, NEW = "all-MiniLM-L6-v2", "all-mpnet-base-v2"
NOT_SHOWN = "not shown (the interval holds the target)"


def test_an_interval_decides_the_verdict() -> None:
    # Every query equal is not enough on 256 queries: the interval reaches below 99.9 %.
    assert at_least(*wilson(256, 256), 0.999) == NOT_SHOWN
    assert at_least(*wilson(4096, 4096), 0.999) == "met"
    assert at_least(*wilson(4090, 4096), 0.999) == NOT_SHOWN
    share = wilson(3900, 4096)
    assert share[2] < 0.999 and at_least(*share, 0.999) == f"missed by {0.999 - share[0]:.4g}"
    # Memory: "under" the limit, the interval's high end below it.
    assert at_most(1.0, -2.0, 4.0, 24.6) == "met"
    assert at_most(1.0, -30.0, 30.0, 24.6) == NOT_SHOWN
    assert at_most(40.0, 30.0, 50.0, 24.6, " MiB") == "missed by 15.4 MiB"
    # No interval (too few sizes): never met.
    growth = {"api_mib_per_100k": 1.0, "api_error_per_100k": None}
    assert at_most(*slope_interval(growth, 3), 24.6) == NOT_SHOWN


def test_the_api_memory_section_states_its_verdict() -> None:
    steps = [
        {"rows": r, "api_mib": 600 + a, "ingest_s": 1.0, "search_ms": 5.0}
        for r, a in ((100_000, 0), (200_000, 1), (300_000, 0.5), (400_000, 1.5), (500_000, 1))
    ]
    growth = {"api_mib_per_100k": 0.3, "api_error_per_100k": 0.2}
    result = {
        "command": "python -m bench.perf.milvus_server api-memory",
        "seconds": 60.0,
        "machine": MACHINE,
        "load_start": [0, 0, 0],
        "load_end": [0, 0, 0],
        "server": {"version": "v2.3.5-lite", "started_here": True, "config": []},
        "dim": 384,
        "batch": 5000,
        "milvus": {"started": {"api_mib": 590}, "steps": steps, "growth": growth},
    }
    faiss = {
        "command": "python -m bench.perf.api_memory",
        "machine": {"date": "earlier"},
        "engines": {"faiss": {"growth": {"api_mib_per_100k": 150.0}}},
    }
    slope, low, high = slope_interval(growth, len(steps))
    assert slope == 0.3
    assert low < 0.3 < high < 15.0  # 0.3 ± t(0.975, 2) × 0.2
    assert "interval under 10% of the FAISS slope, 15.0 MiB per 100k): met." in (
        render_api_memory(result, faiss)
    )
    growth["api_mib_per_100k"] = 20.0
    assert "missed by 5 MiB per 100k rows." in render_api_memory(result, faiss)


def test_the_bridged_difference_is_judged_on_its_paired_interval() -> None:
    # From the discordant pairs alone: the same as a t interval over the per-query differences.
    n, only_milvus, only_faiss = 9_600, 30, 12
    per_query = [1.0] * only_milvus + [-1.0] * only_faiss + [0.0] * (n - only_milvus - only_faiss)
    assert paired_difference(only_milvus, only_faiss, n) == pytest.approx(t_interval(per_query))
    assert within(*paired_difference(only_milvus, only_faiss, n), 0.005) == "met"
    # No discordant query: ± the Wilson bound of 0 of n, not a point (met on 9,600, not on 320).
    assert paired_difference(0, 0, n) == (0.0, -wilson(0, n)[2], wilson(0, n)[2])
    assert within(*paired_difference(0, 0, n), 0.005) == "met"
    assert within(*paired_difference(0, 0, 320), 0.005) == NOT_SHOWN
    # Outside on either side: missed by the difference's excess over the margin.
    assert within(*paired_difference(200, 10, n), 0.005) == f"missed by {190 / n - 0.005:.4g}"
    assert within(*paired_difference(10, 200, n), 0.005) == f"missed by {190 / n - 0.005:.4g}"
    # An interval straddling the margin: not shown.
    assert within(*paired_difference(70, 10, n), 0.005) == NOT_SHOWN


def test_the_bridged_section_states_each_milvus_index_verdict() -> None:
    n = 9_600

    def searched(hits: int, only_here: int, only_faiss: int, identical: int) -> dict:
        return {
            "hits": hits,
            "only_here": only_here,
            "only_faiss": only_faiss,
            "identical": identical,
        }

    gallery = {"upload_s": 9.0, "upgrade_s": 3.0, "search_s": {"bridged": 20.0, "old": 18.0}}
    result = {
        "command": "python -m bench.perf.milvus_server bridged",
        "seconds": 600.0,
        "machine": MACHINE,
        "load_start": [0, 0, 0],
        "load_end": [0, 0, 0],
        "server": {"version": "v2.3.5-lite", "started_here": True, "config": []},
        "synsets": 24_000,
        "trained": 14_400,
        "train_share": 0.6,
        "queries": n,
        "k": 10,
        "reference": "faiss_flat",
        "candidates": 10,
        "ef": 300,
        "hnsw": {"m": 32, "ef_construction": 200},
        "settle_s": 20.0,
        "galleries": {
            "faiss_flat": gallery | {"engine": "faiss", "index": "flat", "server_mib": None},
            "milvus_flat": gallery | {"engine": "milvus", "index": "flat", "ready_s": 12.0},
            "milvus_hnsw": gallery | {"engine": "milvus", "index": "hnsw", "ready_s": 14.0},
        },
        "searches": {
            "bridged": {
                "faiss_flat": searched(4_800, 0, 0, n),
                "milvus_flat": searched(4_800, 0, 0, n),
                "milvus_hnsw": searched(4_610, 10, 200, 9_000),
            },
            "old": {
                "faiss_flat": searched(4_000, 0, 0, n),
                "milvus_flat": searched(4_001, 3, 2, 9_590),
                "milvus_hnsw": searched(3_990, 5, 15, 9_100),
            },
        },
    }
    text = render_bridged(result)
    assert "- Milvus flat − FAISS: +0.0000, 95 % interval -0.0004 to +0.0004" in text
    assert "(target inside ±0.005): met." in text
    assert "- Milvus hnsw − FAISS: -0.0198" in text and f"missed by {190 / n - 0.005:.4g}." in text
    assert "| bridged (MPNet → model) | FAISS engine, flat | 0.5000 | – | – | – |" in text
    assert "| 10 / 200 | 93.75% |" in text
    # The table's interval is the verdict's.
    assert "| old→old (MiniLM) | Milvus engine, flat (COSINE FLAT) | 0.4168 | +0.0001" in text


def test_the_recorded_attach_upgrade_read_only_its_sample_of_vectors() -> None:
    """The committed 1M attach run: the upgrade read the training items' vectors and at most
    the distractor sample's, by id, not the whole collection (a scan read every vector before
    05ab979), and the section says how many."""
    result = json.loads((bench.RESULTS / bench.FILES["attach"]).read_text())
    run = result["run"]
    reads = run["rows_read"]
    assert run["points"] > 2 * MAX_DISTRACTORS
    assert run["paired"] <= reads["upgrade.vectors"] <= run["paired"] + MAX_DISTRACTORS
    assert f"read {reads['upgrade.vectors']:,} stored vectors" in render_attach(result)


def test_the_registry_names_the_sections_as_the_benchmark_publishes_them() -> None:
    milvus = [s for s in SERVER_SECTIONS if s.name.startswith("bench.perf.milvus_server.")]
    registered = {s.name: s.title for s in milvus}
    assert registered == dict(SECTIONS.values())
    assert [s.results[0] for s in milvus] == [
        f"bench/results/{name}" for name in bench.FILES.values()
    ]


@pytest.mark.slow
def test_each_stage_runs_on_the_real_server(
    milvus_server_uri: str,  # noqa: F811  (the fixture)
    tmp_path: Path,
    wordnet_small: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The waits after each seal (about 12 s until the query node serves the sealed segment on
    # this server, then ``SETTLE_S``) keep searches off the server's interim index: they are for
    # the figures, not for the path, and would add over a minute here. So the figures below may
    # come from the interim index: only their shape is checked.
    monkeypatch.setattr(bench.engines, "served", lambda client, name, rows: None)
    monkeypatch.setattr(bench.engines, "SETTLE_S", 0.0)
    common = ["--quick", "--uri", milvus_server_uri]
    out = tmp_path / "engines.json"
    result = bench.main(["engines", *common, "--cosine-only", "--out", str(out)])
    assert json.loads(out.read_text())["server"]["version"].startswith("v2.3")
    cosine = result["milvus"]["layouts"]["cosine_r1"]["equal_top_10"]
    assert cosine["queries"] == bench.QUICK_EQUAL_QUERIES and 0 < cosine["equal"] <= 256
    assert "Old→old ordered top-10 = exact, cosine_r1" in bench.render_engines(result)

    out = tmp_path / "api_memory.json"
    result = bench.main(["api-memory", *common, "--out", str(out)])
    steps = result["milvus"]["steps"]
    assert [s["rows"] for s in steps] == list(bench.QUICK_SIZES)
    assert all("milvus_mib" not in s for s in steps)  # a server elsewhere: not measured
    assert math.isfinite(slope_interval(result["milvus"]["growth"], len(steps))[1])

    arrays = {
        f"{field}.{model}": np.asarray(wordnet_small[f"{field}.{model}"], dtype=np.float32)
        for field in ("gloss", "lemma")
        for model in (OLD, NEW)
    }
    out = tmp_path / "attach.json"
    result = bench.main(["attach", *common, "--out", str(out)], arrays=arrays)
    run = result["run"]
    assert run["count"] == bench.QUICK_ROWS
    assert run["rows_read"].get("attach.vectors", 0) == 0
    assert "(target under 1 %; a byte count, no interval): met." in bench.render_attach(result)

    out = tmp_path / "bridged.json"
    # One Milvus index (hnsw; flat differs only in the gallery's ``index``): about 9 s, not 16.
    result = bench.main(
        ["bridged", *common, "--milvus-index", "hnsw", "--out", str(out)], arrays=arrays
    )
    held = len(arrays[f"gloss.{OLD}"]) - round(bench.TRAIN_SHARE * len(arrays[f"gloss.{OLD}"]))
    assert result["queries"] == held
    assert list(result["galleries"]) == ["faiss_flat", "milvus_hnsw"]
    assert result["galleries"]["milvus_hnsw"]["ready_s"] >= 0
    for searched in result["searches"].values():
        faiss = searched["faiss_flat"]
        assert faiss["only_here"] == faiss["only_faiss"] == 0 and faiss["identical"] == held
        assert all(0 < s["hits"] <= held for s in searched.values())
    assert "- Milvus hnsw − FAISS:" in bench.render_bridged(result)
