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
        mean, low, high = curve["0.25"]["R@10"]
        # A bootstrap over queries that differ: an interval of some width around the mean.
        assert low < mean < high, name
    # Every query's rank at the ends is exactly the one-space search's.
    assert set(payload["runs"][0]["max_rank_change_at_ends"].values()) == {0}
    assert payload["served_calibration"] in payload["area_r10"]
    lines = transition.targets(payload)
    assert len(lines) == len(transition.INTERPOLATION_FRACTIONS) + 1
    served = f"transition ({payload['served_calibration']})"
    for f, line in zip(transition.INTERPOLATION_FRACTIONS, lines, strict=False):
        gap = summary["interpolation_gap"][served][str(f)]["R@10"][0]
        # The line's state is the rule's on these figures (not merely one of the two words).
        assert line.endswith("met") == (gap >= 0), (line, gap)
        if gap < 0:
            assert f"missed by {-gap:.4f}" in line


def test_transition_targets_state_each_side_of_the_rule() -> None:
    """Constructed summaries: a gap at or above 0 is met, below is missed by its size (and says
    so when the interval reaches 0); the bridged line compares with its share of reindex."""

    def payload(gap: list[float], bridged: float) -> dict:
        served = "transition (relevance)"
        return {
            "served_calibration": "relevance",
            "method": "procrustes",
            "summary": {
                "interpolation_gap": {
                    served: {str(f): {"R@10": gap} for f in transition.INTERPOLATION_FRACTIONS}
                },
                "curves": {
                    "bridged (relevance)": {
                        str(transition.BRIDGED_TARGET[0]): {"R@10": [bridged, 0.0, 1.0]}
                    }
                },
                "baselines": {"reindex": {"R@10": [0.6, 0.5, 0.7]}},
            },
        }

    goal = transition.BRIDGED_TARGET[1] * 0.6
    met = transition.targets(payload([0.01, 0.005, 0.02], goal + 0.01))
    assert all(line.endswith("— met") for line in met)
    missed = transition.targets(payload([-0.02, -0.03, -0.01], goal - 0.05))
    assert all("missed by" in line for line in missed)
    assert "missed by 0.0200" in missed[0] and "within the interval" not in missed[0]
    assert f"missed by {0.05:.3f}" in missed[-1]
    near = transition.targets(payload([-0.01, -0.03, 0.01], goal))
    assert "(within the interval)" in near[0] and near[-1].endswith("met")
