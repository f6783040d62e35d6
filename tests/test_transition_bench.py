"""bench.quality.transition: its intervals are Student t over seed means of paired differences,
and a target is "met" only when that interval clears it (issue 42 items 4 and 7)."""

from __future__ import annotations

import json
import math

import pytest

from bench.quality import transition

# Student t's 0.975 quantile with 2 degrees of freedom, from a table (not from the code under test).
T_975_DF2 = 4.302652729749464
CURVES = [f"{s} ({c})" for c in ("tail", "relevance") for s in transition.SEARCHES]
FRACTIONS = ("0.0", "0.1", "0.25", "0.5", "1.0")


def run(stay: float, reindex: float, bridge: float, gap: float, bridged_25: float) -> dict:
    """One seed's means: every curve on its stay→reindex (or bridge→reindex) line plus ``gap``
    inside (0, 1), and the bridged curves at 25 % set to ``bridged_25``. R@1 = R@10 / 2."""

    def both(r10: float) -> dict[str, float]:
        return {"R@10": r10, "R@1": r10 / 2}

    means: dict = {"stay": both(stay), "reindex": both(reindex), "bridge": both(bridge)}
    for name in CURVES:
        start = stay if name.startswith("transition") else bridge
        curve = {}
        for f in FRACTIONS:
            x = float(f)
            line = (1 - x) * start + x * reindex
            curve[f] = both(line + (gap if 0 < x < 1 else 0.0))
        if name.startswith("bridged"):
            curve["0.25"] = both(bridged_25)
        means[name] = curve
    return {"means": means, "max_rank_change_at_ends": {"relevance transition 0%": 0}}


def payload(runs: list[dict]) -> dict:
    return {
        "command": "python -m bench.quality.transition",
        "seeds": list(range(len(runs))),
        "n_items": 100,
        "queries_per_seed": 40,
        "method": "procrustes",
        "elapsed_minutes": 1.0,
        "machine": "test",
        "served_calibration": "relevance",
        "summary": transition.summarise(runs),
        "runs": runs,
    }


def hand_t_interval(values: list[float]) -> tuple[float, float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T_975_DF2 * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def test_gap_interval_is_the_t_interval_over_the_seed_gaps() -> None:
    """Three seeds whose gaps are 0.01, 0.02, 0.03 (and whose baselines differ, so an interval of
    the curve alone would not be the gap's): the gap's interval is 0.02 ± t·0.01/√3."""
    runs = [
        run(0.50, 0.60, 0.40, 0.01, 0.55),
        run(0.55, 0.70, 0.45, 0.02, 0.60),
        run(0.45, 0.50, 0.35, 0.03, 0.50),
    ]
    s = transition.summarise(runs)
    gap = s["interpolation_gap"]["transition (relevance)"]["0.25"]["R@10"]
    assert gap == pytest.approx(hand_t_interval([0.01, 0.02, 0.03]), abs=1e-9)
    assert gap[1] == pytest.approx(0.02 - T_975_DF2 * 0.01 / math.sqrt(3), abs=1e-9)
    # Paired per seed: curve − stay at 25 % is 0.25 · (reindex − stay) + gap in each seed.
    minus_stay = s["minus_stay"]["transition (relevance)"]["0.25"]["R@10"]
    assert minus_stay == pytest.approx(
        hand_t_interval([0.025 + 0.01, 0.0375 + 0.02, 0.0125 + 0.03]), abs=1e-9
    )
    bridged = s["bridged_minus_share_of_reindex"]["relevance"]
    assert bridged == pytest.approx(
        hand_t_interval([0.55 - 0.54, 0.60 - 0.63, 0.50 - 0.45]), abs=1e-9
    )
    # A baseline's interval is the t interval of its seed means too.
    assert s["baselines"]["stay"]["R@1"] == pytest.approx(
        hand_t_interval([0.25, 0.275, 0.225]), abs=1e-9
    )
    assert "n = 3 seed means" in s["interval"]


def test_met_only_when_the_lower_bound_clears_the_target() -> None:
    """Gaps 0.03, 0.04, 0.05 clear 0: met. One seed broken to −0.05 keeps the mean above 0 (a
    point rule would still say met) but the interval straddles 0: not shown. All below: missed."""
    stays = (0.50, 0.55, 0.45)

    def lines(gaps: tuple[float, ...], bridged: tuple[float, ...]) -> list[str]:
        runs = [
            run(stay, stay + 0.1, stay - 0.1, gap, b)
            for stay, gap, b in zip(stays, gaps, bridged, strict=True)
        ]
        return transition.targets(payload(runs))

    n_gap_lines = len(transition.INTERPOLATION_FRACTIONS)
    # Bridged at 25 %: 0.9 × reindex is 0.54, 0.585, 0.495 per seed.
    met = lines((0.03, 0.04, 0.05), (0.56, 0.61, 0.51))
    assert len(met) == n_gap_lines + 1
    assert all(line.endswith("— met") for line in met), met

    broken = lines((0.03, 0.04, -0.05), (0.56, 0.61, 0.46))
    assert all(line.endswith("— not shown") for line in broken), broken

    below = lines((-0.03, -0.04, -0.05), (0.52, 0.57, 0.47))
    assert all("— missed by " in line for line in below), below
    assert below[0].endswith("missed by 0.040")
    assert below[-1].endswith("missed by 0.020")


def test_rendered_section_says_what_every_interval_covers() -> None:
    runs = [run(0.5 + 0.01 * i, 0.6, 0.4, 0.01 * i, 0.55) for i in range(3)]
    text = transition.render_markdown(payload(runs))
    assert "mean [95 % interval: mean ± t(0.975, n−1)·sd/√n over the n = 3 seed means" in text
    assert "paired per seed" in text and "per query" not in text
    assert "bootstrap" not in text


@pytest.mark.slow
def test_quick_transition_bench_keeps_seed_means_and_exact_ends(tmp_path) -> None:
    """One seed of the committed fixture: both searches and calibrations, every query's rank
    exact at the ends, the summary a function of the saved seed means — and one seed has no
    interval, so no target can be met on it."""
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
    assert set(payload["runs"][0]["max_rank_change_at_ends"].values()) == {0}
    assert payload["served_calibration"] in payload["area_r10"]
    again = json.loads(json.dumps(transition.summarise(payload["runs"])))
    assert json.dumps(again) == json.dumps(summary)
    assert all(line.endswith("— not shown") for line in transition.targets(payload))
