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
