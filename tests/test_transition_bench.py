"""bench.quality.transition on the committed fixture: both searches, both calibrations, exact ends."""

from __future__ import annotations

import json

import pytest

from bench.quality import transition


@pytest.mark.slow
def test_quick_transition_bench_measures_both_searches_with_exact_ends(tmp_path) -> None:
    out = transition.main(["--quick", "--out", str(tmp_path / "t.json")])
    payload = json.loads(out.read_text())
    summary = payload["summary"]
    names = {f"{s} ({c})" for s in transition.SEARCHES for c in ("tail", "relevance")}
    assert set(summary["curves"]) == names
    stay = summary["baselines"]["stay"]["R@10"][0]
    reindex = summary["baselines"]["reindex"]["R@10"][0]
    bridge = summary["baselines"]["bridge"]["R@10"][0]
    for name, curve in summary["curves"].items():
        start = stay if name.startswith("transition") else bridge
        assert curve["0.0"]["R@10"][0] == pytest.approx(start)
        assert curve["1.0"]["R@10"][0] == pytest.approx(reindex)
        low, high = curve["0.25"]["R@10"][1:]
        assert low <= curve["0.25"]["R@10"][0] <= high
    # Every query's rank at the ends is exactly the one-space search's.
    assert set(payload["runs"][0]["max_rank_change_at_ends"].values()) == {0}
    assert payload["served_calibration"] in payload["area_r10"]
    lines = transition.targets(payload)
    assert len(lines) == len(transition.INTERPOLATION_FRACTIONS) + 1
    assert all(("met" in line) or ("missed by" in line) for line in lines)
