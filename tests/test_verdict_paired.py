"""Issue 42 item 5: every alternative of the verdict is compared by one rule — the paired
per-query difference on the same held-out queries, ``SIGNIFICANCE`` (2) standard errors — not by
a bare comparison of two means (before: "bridge" on ``bridge > stay`` alone, while the two-stage
rule and the transition outlook asked for 2 standard errors).

The report carries the paired differences the verdict reads (``paired_gains``), and their means
are exactly the differences of the report's own figures."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.ml.auto.verdict import REINDEX_BELOW_ARR, SIGNIFICANCE, recommend
from app.ml.geometry.space import EuclideanLift
from app.ml.upgrade.run import QueryLog, UpgradeData, run_backbone_upgrade
from bench.common.wordnet import NEW_MODEL, OLD_MODEL


def _metrics(bridge: float, stay: float, reindex: float) -> dict[str, Any]:
    return {
        "served": {
            "query": {"recall@10": bridge},
            "arr": {"query": {"recall@10": bridge / reindex}},
        },
        "reindex": {"query": {"recall@10": reindex}},
        "stay": {"query": {"recall@10": stay}},
    }


def _paired(
    bridge: float, stay: float, reindex: float, se: float, share_se: float | None = None
) -> dict[str, Any]:
    """Paired differences whose means are the figures' differences, each with standard error
    ``se`` (``share_se`` for bridge − share × reindex)."""
    return {
        "view": "query",
        "metric": "recall@10",
        "queries": 400,
        "bridge_vs_stay": {"mean": bridge - stay, "se": se},
        "reindex_vs_stay": {"mean": reindex - stay, "se": se},
        "bridge_vs_reindex_share": {
            "mean": bridge - REINDEX_BELOW_ARR * reindex,
            "se": se if share_se is None else share_se,
            "share": REINDEX_BELOW_ARR,
        },
    }


def test_significance_is_two_standard_errors() -> None:
    assert SIGNIFICANCE == 2.0


def test_a_bridge_within_two_standard_errors_of_stay_is_not_a_bridge_verdict() -> None:
    # The bridge's point figure beats stay's (0.52 > 0.49) and it keeps 0.91 of the reindex,
    # but the paired gain (+0.03) is within 2 × 0.02: no evidence that switching pays off.
    # The new model's own gain over stay (+0.01) is within it too: the rule says stay.
    figures = (0.52, 0.49, 0.50)
    noisy = recommend(_metrics(*figures), "served", "query", paired=_paired(*figures, se=0.02))
    assert noisy["action"] == "stay", noisy["why"]
    assert "+0.030 ± 0.020" in noisy["why"] and "standard errors" in noisy["why"]
    assert noisy["evidence"] == "paired" and noisy["paired"]["queries"] == 400
    # The same point figures, a gain beyond 2 standard errors: bridge.
    clear = recommend(_metrics(*figures), "served", "query", paired=_paired(*figures, se=0.01))
    assert clear["action"] == "bridge", clear["why"]
    assert "+0.030 ± 0.010" in clear["why"]


def test_a_noisy_bridge_with_a_measurable_new_model_is_a_transition() -> None:
    # bridge − stay +0.03 within 2 × 0.02; reindex − stay +0.08 beyond it.
    figures = (0.52, 0.49, 0.57)
    paired = _paired(*figures, se=0.02)
    verdict = recommend(_metrics(*figures), "served", "query", paired=paired)
    assert verdict["action"] == "transition" and "the bridge does not" in verdict["why"]


def test_a_new_model_within_two_standard_errors_of_stay_is_no_transition() -> None:
    # The point rule said transition here (reindex 0.52 > stay 0.49, bridge below stay).
    figures = (0.44, 0.49, 0.52)
    assert recommend(_metrics(*figures), "served", "query")["action"] == "transition"
    paired = _paired(*figures, se=0.02)
    assert recommend(_metrics(*figures), "served", "query", paired=paired)["action"] == "stay"


def test_keeping_too_little_of_the_reindex_needs_evidence_too() -> None:
    # Bridge +0.06 over stay (beyond 2 × 0.01); its ARR 0.70 < 0.75, bridge − 0.75 × reindex
    # = −0.0275.
    figures = (0.385, 0.325, 0.55)
    metrics = _metrics(*figures)
    short = _paired(*figures, se=0.01, share_se=0.01)
    assert recommend(metrics, "served", "query", paired=short)["action"] == "transition"
    within = _paired(*figures, se=0.01, share_se=0.02)
    assert recommend(metrics, "served", "query", paired=within)["action"] == "bridge"
    # The old model gone: reindex only on a shortfall beyond 2 standard errors.
    gone = {"old_model_available": False}
    assert recommend(metrics, "served", "query", paired=short, **gone)["action"] == "reindex"
    kept = recommend(metrics, "served", "query", paired=within, **gone)
    assert kept["action"] == "bridge" and "bridge − 0.75 × reindex -0.028 ± 0.020" in kept["why"]
    assert "bridge − stay" not in kept["why"]  # stay is not an option


def test_without_per_query_figures_the_verdict_says_it_compared_points() -> None:
    verdict = recommend(_metrics(0.52, 0.49, 0.57), "served", "query")
    assert verdict["action"] == "bridge" and verdict["evidence"] == "point"
    assert "point figures" in verdict["why"] and "paired" not in verdict


def test_paired_differences_of_another_view_are_refused() -> None:
    paired = {**_paired(0.52, 0.49, 0.57, se=0.01), "view": "class", "metric": "cmc1"}
    with pytest.raises(ValueError, match="cannot judge"):
        recommend(_metrics(0.52, 0.49, 0.57), "served", "query", paired=paired)


def _curve(value: float, gain: tuple[float, float], vs_bridge: tuple[float, float]) -> dict:
    entry = {
        "recall@10": value,
        "gain": {"mean": gain[0], "se": gain[1]},
        "vs_bridge": {"mean": vs_bridge[0], "se": vs_bridge[1]},
    }
    return {
        "default_depth": 200,
        "queries": 300,
        "gain_against": {"old": "stay", "bridge": "bridge"},
        "old": {"200": entry},
        "bridge": {"200": entry},
    }


def test_two_stage_reaching_the_bridge_is_judged_by_the_paired_rule() -> None:
    figures = (0.55, 0.49, 0.62)
    metrics, paired = _metrics(*figures), _paired(*figures, se=0.01)
    # Two stages 0.01 below the bridge's point figure, within 2 × 0.01: it reaches the bridge.
    level = recommend(
        metrics,
        "served",
        "query",
        two_stage=_curve(0.54, (0.05, 0.01), (-0.01, 0.01)),
        paired=paired,
    )
    assert level["action"] == "two-stage", level["why"]
    # 0.03 below, beyond 2 × 0.01: it does not; the bridge clears stay: bridge.
    below = recommend(
        metrics,
        "served",
        "query",
        two_stage=_curve(0.52, (0.03, 0.01), (-0.03, 0.01)),
        paired=paired,
    )
    assert below["action"] == "bridge", below["why"]


def _data(wordnet_small: dict, *, log: bool) -> UpgradeData:
    rows = np.arange(0, len(wordnet_small["label"]), 2)
    queries = None
    if log:
        queries = QueryLog(
            features=wordnet_small[f"lemma.{NEW_MODEL}"][rows],
            old_vectors=wordnet_small[f"lemma.{OLD_MODEL}"][rows],
            relevant=[np.array([i]) for i in range(rows.size)],
        )
    labels = np.unique(wordnet_small["label"][rows], return_inverse=True)[1]
    return UpgradeData(
        wordnet_small[f"gloss.{NEW_MODEL}"][rows],
        wordnet_small[f"gloss.{OLD_MODEL}"][rows],
        labels,
        queries,
    )


@pytest.mark.parametrize(
    ("objective", "view", "metric"), [("query", "query", "recall@10"), ("class", "class", "cmc1")]
)
def test_an_upgrade_report_carries_the_paired_differences_its_verdict_reads(
    wordnet_small: dict, objective: str, view: str, metric: str
) -> None:
    data = _data(wordnet_small, log=objective == "query")
    report = run_backbone_upgrade(
        "procrustes", data, EuclideanLift(), objective=objective, eval_fraction=0.4
    ).report
    paired, metrics = report["paired_gains"], report["metrics"]
    assert (paired["view"], paired["metric"]) == (view, metric)
    assert paired["queries"] == (
        report["n_eval_queries_with_relevance"] if view == "query" else report["n_eval"]
    )

    def figure(name: str) -> float:
        return metrics[name][view][metric]

    # The means are exactly the report's own differences; the errors are paired ones (> 0).
    for key, (a, b, scale) in {
        "bridge_vs_stay": ("procrustes", "stay", 1.0),
        "reindex_vs_stay": ("reindex", "stay", 1.0),
    }.items():
        assert paired[key]["mean"] == pytest.approx(figure(a) - scale * figure(b), abs=1e-12)
        assert paired[key]["se"] > 0
    share = paired["bridge_vs_reindex_share"]
    assert share["mean"] == pytest.approx(
        figure("procrustes") - REINDEX_BELOW_ARR * figure("reindex"), abs=1e-12
    )
    rec = report["recommendation"]
    assert rec["evidence"] == "paired" and rec["paired"] == paired
    if view == "query":
        # The two-stage curve carries its floors as paired differences too.
        entry = report["two_stage"]["old"][str(report["two_stage"]["default_depth"])]
        assert entry["vs_bridge"]["mean"] == pytest.approx(
            entry["recall@10"] - figure("procrustes"), abs=1e-12
        )
