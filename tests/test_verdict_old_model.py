"""Issue 26, item 1: a served model is never silently worse than staying. Whatever the verdict,
every measured view where the old model beats the served bridge on that view's primary metric
is named in the recommendation (``below_old_model``) and in its text, and the report page shows
it."""

from __future__ import annotations

from app.ml.auto.verdict import recommend
from app.upgrades.report_html import render_report_html


def _class_and_instance(bridge_cmc1: float, stay_cmc1: float) -> dict:
    """An explicit class-level job without a query log (the issue's private case: hbct served
    at CMC@1 0.257 against the old model's 0.338, own-item R@1 0.40)."""
    return {
        "hbct": {
            "instance": {"recall@1": 0.40},
            "class": {"cmc1": bridge_cmc1},
            "arr": {"instance": {"recall@1": 0.40}, "class": {"cmc1": bridge_cmc1 / 0.45}},
        },
        "reindex": {"instance": {"recall@1": 1.0}, "class": {"cmc1": 0.45}},
        "stay": {"instance": {"recall@1": 1.0}, "class": {"cmc1": stay_cmc1}},
    }


def test_a_measure_verdict_still_says_the_bridge_loses_to_the_old_model() -> None:
    # The query objective is not measurable (no log): the verdict falls back to own-item recall.
    verdict = recommend(_class_and_instance(0.257, 0.338), "hbct", "query", view="instance")
    assert verdict["action"] == "measure"
    assert verdict["below_old_model"] == [
        {"view": "class", "metric": "cmc1", "bridge": 0.257, "stay": 0.338}
    ]
    assert "worse than not upgrading" in verdict["why"]
    assert "class cmc1: bridge (hbct) 0.257, stay 0.338" in verdict["why"]


def test_own_item_recall_is_never_counted_as_losing_to_the_old_model() -> None:
    """Stay's own-item recall is 1 by construction: every bridge is 'below' it there, which
    says nothing about the old model's search."""
    verdict = recommend(_class_and_instance(0.40, 0.338), "hbct", "query", view="instance")
    assert verdict["below_old_model"] == []
    assert "worse than not upgrading" not in verdict["why"]


def test_the_objective_view_losing_is_named_too() -> None:
    verdict = recommend(_class_and_instance(0.257, 0.338), "hbct", "class")
    # The new model (reindex 0.45) beats the old one and the bridge does not: transition.
    assert verdict["action"] == "transition"
    worse_new = _class_and_instance(0.257, 0.338)
    worse_new["reindex"]["class"]["cmc1"] = 0.30
    assert recommend(worse_new, "hbct", "class")["action"] == "stay"
    assert [b["view"] for b in verdict["below_old_model"]] == ["class"]
    gone = recommend(_class_and_instance(0.257, 0.338), "hbct", "class", old_model_available=False)
    # Staying is not an option, but the user still learns the bridge is below the old model.
    assert [b["view"] for b in gone["below_old_model"]] == ["class"]


def test_the_report_page_shows_the_warning() -> None:
    verdict = recommend(_class_and_instance(0.257, 0.338), "hbct", "query", view="instance")
    page = render_report_html(
        {"id": "upg_x", "method": "hbct", "report": {"recommendation": verdict}}
    )
    assert "below the old model" in page and "class cmc1" in page
    quiet = recommend(_class_and_instance(0.40, 0.338), "hbct", "query", view="instance")
    assert "below the old model" not in render_report_html(
        {"id": "upg_x", "method": "hbct", "report": {"recommendation": quiet}}
    )


def _query_metrics(bridge: float, stay: float, reindex: float) -> dict:
    return {
        "served": {
            "query": {"recall@10": bridge},
            "arr": {"query": {"recall@10": bridge / reindex}},
        },
        "reindex": {"query": {"recall@10": reindex}},
        "stay": {"query": {"recall@10": stay}},
    }


def _curve(old: float, old_gain: tuple[float, float], bridged: float, bridged_gain) -> dict:
    def entry(value, gain):
        return {"200": {"recall@10": value, "gain": {"mean": gain[0], "se": gain[1]}}}

    return {
        "default_depth": 200,
        "queries": 300,
        "gain_against": {"old": "stay", "bridge": "bridge"},
        "old": entry(old, old_gain),
        "bridge": entry(bridged, bridged_gain),
    }


def test_two_stage_is_the_verdict_only_where_its_paired_gain_is_significant() -> None:
    metrics = _query_metrics(bridge=0.44, stay=0.49, reindex=0.57)
    significant = _curve(0.56, (0.07, 0.01), 0.55, (0.11, 0.01))
    rec = recommend(metrics, "served", "query", two_stage=significant)
    assert rec["action"] == "two-stage" and rec["two_stage"]["depth"] == 200
    assert rec["two_stage"]["expected_recall@10"] == 0.56 and rec["two_stage"]["against"] == "stay"
    # Within two standard errors: no evidence, the earlier rules answer (transition here).
    noisy = _curve(0.56, (0.015, 0.01), 0.55, (0.11, 0.01))
    assert recommend(metrics, "served", "query", two_stage=noisy)["action"] == "transition"
    # Below the bridge alone: not two-stage either.
    beaten = recommend(
        _query_metrics(bridge=0.60, stay=0.49, reindex=0.62),
        "served",
        "query",
        two_stage=_curve(0.58, (0.09, 0.01), 0.55, (0.11, 0.01)),
    )
    assert beaten["action"] == "bridge"
    # Another view (class): two-stage is a query-view figure and is not used.
    assert (
        recommend(metrics, "served", "query", view="instance", two_stage=significant)["action"]
        == "measure"
    )


def test_with_the_old_model_gone_two_stage_needs_most_of_the_reindex() -> None:
    metrics = _query_metrics(bridge=0.30, stay=0.49, reindex=0.57)
    gone = recommend(
        metrics,
        "served",
        "query",
        old_model_available=False,
        two_stage=_curve(0.56, (0.07, 0.01), 0.55, (0.25, 0.01)),
    )
    assert gone["action"] == "two-stage" and gone["two_stage"]["against"] == "bridge"
    assert "--old-queries" not in gone["next_step"]
    weak = recommend(
        metrics,
        "served",
        "query",
        old_model_available=False,
        two_stage=_curve(0.56, (0.07, 0.01), 0.40, (0.10, 0.01)),
    )
    assert weak["action"] == "reindex"  # 0.40 < 0.75 × 0.57


def test_a_bridge_judged_on_class_search_names_query_search_as_unmeasured() -> None:
    """Issue 44 item 1: with labels and no query log the evidence is class search alone; a
    bridge verdict there says query → document search is not measured and how to search
    meanwhile, and a measure verdict says what to send instead of calling the bridge served."""
    winning = recommend(_class_and_instance(0.40, 0.338), "hbct", "class")
    assert winning["action"] == "bridge" and winning["unmeasured"] == ["query"]
    assert "query → document search through the bridge is not measured" in winning["why"]
    assert "old_vectors" in winning["why"] and "--old-queries" in winning["why"]
    measured_on_queries = {
        "hbct": {"query": {"recall@10": 0.5}, "arr": {"query": {"recall@10": 0.9}}},
        "reindex": {"query": {"recall@10": 0.55}},
        "stay": {"query": {"recall@10": 0.45}},
    }
    on_queries = recommend(measured_on_queries, "hbct", "query")
    assert on_queries["action"] == "bridge" and "unmeasured" not in on_queries
    measure = recommend(_class_and_instance(0.257, 0.338), "hbct", "query", view="instance")
    assert "is served meanwhile" not in measure["why"]
    assert "--old-queries" in measure["why"] and "old_vectors" in measure["why"]
