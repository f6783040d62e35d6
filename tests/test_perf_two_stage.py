"""The two-stage speed benchmark's --quick path (``bench.perf.two_stage``) on the committed
fixture: a small gallery, the embedder stand-in in its own process, every variant timed. No
speed is asserted (the benchmark measures it); what is asserted is what each variant did, which
is what makes its timing mean anything: a warm search embeds nothing and scores every candidate
with the new model, a cold one embeds every candidate in one embedder call at batch 1 (and in
ceil(candidates ÷ max_batch) calls above it), and the result has the shape the renderer reads."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

import bench.perf.two_stage as bench
from bench.common import embedder_server as server


def test_quick_two_stage_benchmark(tmp_path: Path) -> None:
    out = tmp_path / "two_stage_perf.json"
    result = bench.main(["--quick", "--size", "2000", "--batches", "1", "4", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["size"] == 2000 and result["depth"] == 200 and result["max_batch"] == 256
    for batch in ("1", "4"):
        entry = result["batches"][batch]
        for name in bench.VARIANTS:
            assert entry[name]["calls"] == 3 and 0 < entry[name]["p50_ms"] <= entry[name]["p95_ms"]
        for figure in (
            "warm_vs_plain",
            "cold_vs_plain",
            "cold_vs_plain_plus_embedder",
            "stage1_vs_plain",
            "stage1_share_of_warm",
            "stage1_overfetch_vs_plain",
        ):
            assert entry[figure]["n"] == 3 and entry[figure]["mean"] > 0
            assert entry[figure]["low"] <= entry[figure]["mean"] <= entry[figure]["high"]
        checks = entry["checks"]
        assert checks["warm_embedded"] == [0] and checks["warm_all_scored_new"]
        assert checks["cold_embedded_all"] and checks["cold_all_scored_new"]
        assert checks["degraded"] == []
        assert checks["cold_embedder_calls"] == checks["cold_expected_calls"]
        if batch == "1":
            # Depth 200 ≤ max_batch: one batched call for every candidate of the search.
            assert checks["candidates_mean"] == 200 and checks["cold_embedder_calls"] == [1] * 3
        else:
            assert checks["candidates_mean"] > 256
            assert all(n >= 2 for n in checks["cold_embedder_calls"])
    assert {t["batch"] for t in result["targets"]} == {1, 4} and len(result["targets"]) == 4
    assert all(
        t["verdict"] in ("met", "missed") or t["verdict"].startswith("undecided")
        for t in result["targets"]
    )
    markdown = bench.render_markdown(result)
    assert "| 4 | cold |" in markdown and "warm ≤ 1.5 × plain" in markdown


def test_the_embedder_stand_ins_fast_answers_are_the_same_bytes() -> None:
    """The --wordnet mode answers from vectors formatted once at start (``json_arrays``): the
    bytes must be those the default path writes for the same texts, prefixes and unknown texts
    included, so that the benchmark's round trips carry what a formatting server sends."""
    vectors = server.recorded_vectors()
    servers = [
        server.ThreadingHTTPServer(("127.0.0.1", 0), server.make_handler(state))
        for state in (
            server.State(vectors, None),
            server.State(vectors, None, encoded=server.json_arrays(vectors)),
        )
    ]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        texts = ["passage: " + t for t in list(vectors)[:300]]
        for body in (
            {"model": "m", "input": texts},
            {"model": None, "input": texts[0]},
            {"model": "m", "input": [*texts[:3], "no such text"]},
        ):
            plain, fast = (
                httpx.post(f"http://127.0.0.1:{s.server_port}/v1/embeddings", json=body)
                for s in servers
            )
            assert plain.status_code == fast.status_code
            assert plain.content == fast.content
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
