"""The report page's pieces that decide what is drawn (pure; the page itself is read by Chromium
in tests/service/test_report_page.py)."""

from __future__ import annotations

from app.upgrades.report_html import (
    MIN_UNCERTAINTY_SPREAD,
    _calibration,
    _candidates,
    _value_axis,
    measured_meanings,
)


def _metrics(values: dict[str, float]) -> dict:
    return {name: {"instance": {"recall@1": v}} for name, v in values.items()}


def test_the_value_axis_starts_at_zero() -> None:
    """Issue 44 item 7: own-item recall near 1 for every map was drawn on an axis from 0.95, so
    a 2-point gap looked like 20. Every axis starts at 0 and reaches past the largest figure."""
    assert _value_axis(_metrics({"a": 0.97, "b": 0.99}), ["a", "b"], ["recall@1"], "instance") == (
        0.0,
        1.05,
    )
    assert _value_axis(_metrics({"a": 0.2, "b": 0.6}), ["a", "b"], ["recall@1"], "instance")[0] == 0
    assert _value_axis(_metrics({"a": float("nan")}), ["a"], ["recall@1"], "instance") == (0, 1.05)
    low, high = _value_axis(_metrics({"a": 1.8}), ["a"], ["recall@1"], "instance")
    assert low == 0 and high > 1.8


def test_the_instance_view_has_no_stay_row_the_verdict_calls_n_a() -> None:
    from app.upgrades.report_html import render_report_html

    metrics = {
        "stay": {"instance": {"recall@1": 0.999}},
        "procrustes": {"instance": {"recall@1": 0.97}},
        "reindex": {"instance": {"recall@1": 1.0}},
    }
    job = {
        "id": "upg_1",
        "status": "succeeded",
        "method": "procrustes",
        "report": {"metrics": metrics, "views": ["instance"], "chosen_method": "procrustes"},
    }
    page = render_report_html(job)
    assert "0.999" not in page and "<td>procrustes</td>" in page


def test_a_degenerate_calibration_is_said_not_plotted() -> None:
    flat = {
        "bins": [{"uncertainty": 0.4 + i * 1e-9, "failure_rate": 0.1 * i} for i in range(5)],
        "spearman": 0.01,
        "spearman_shuffled": 0.0,
    }
    page = _calibration(flat)
    assert "<img" not in page and "no plot" in page and "Spearman" in page
    spread = [
        {"uncertainty": i * 10 * MIN_UNCERTAINTY_SPREAD, "failure_rate": 0.1} for i in range(5)
    ]
    assert "<img" in _calibration({"bins": spread})


def test_the_glossary_lists_only_what_was_measured() -> None:
    meanings = {
        "instance": {"recall@1": "own item first"},
        "query": {"recall@10": "a relevant item in the top 10", "mrr@100": "reciprocal rank"},
        "class": {"cmc1": "same class first"},
        "arr": "bridged / reindex",
    }
    metrics = {
        "stay": {"query": {"recall@10": 0.5}},
        "served": {"instance": {"recall@1": 0.98}, "query": {"recall@10": 0.4}, "arr": {}},
    }
    assert measured_meanings(meanings, metrics) == {
        "instance": {"recall@1": "own item first"},
        "query": {"recall@10": "a relevant item in the top 10"},
        "arr": "bridged / reindex",
    }


def test_each_candidate_shows_its_validation_figures_beside_its_settings() -> None:
    candidates = [
        {
            "name": "procrustes",
            "validation": {"query": {"recall@10": 0.41}, "instance": {"recall@1": 0.97}},
            "chosen_settings": {},
            "eligible": True,
        },
        {
            "name": "instance-map",
            "validation": {"query": {"recall@10": 0.45}, "instance": {"recall@1": 0.96}},
            "chosen_settings": {"temperature": 0.05},
            "eligible": True,
        },
    ]
    page = _candidates(candidates, "instance-map")
    assert "validation query recall@10" in page and "validation instance recall@1" in page
    assert "0.450" in page and "0.970" in page and "temperature=0.05" in page


def test_the_two_stage_curve_is_a_table_of_every_depth() -> None:
    from app.upgrades.report_html import _two_stage

    curve = {
        "queries": 120,
        "depths": [10, 50],
        "old": {
            "10": {"recall@10": 0.41, "embedded_per_query": 9.5},
            "50": {"recall@10": 0.52, "embedded_per_query": 40.0},
        },
        "bridge": {
            "10": {"recall@10": 0.37, "embedded_per_query": 9.0},
            "50": {"recall@10": 0.49, "embedded_per_query": 38.0},
        },
    }
    metrics = {"stay": {"query": {"recall@10": 0.41}}, "reindex": {"query": {"recall@10": 0.55}}}
    page = _two_stage(curve, metrics)
    assert page.count("<tr>") == 3 and "0.520" in page and "0.490" in page and "120" in page
    assert "stay 0.410" in page and "reindex 0.550" in page
    assert _two_stage(None, metrics) == ""
    without_old = {k: v for k, v in curve.items() if k != "old"}
    assert "old query vectors" not in _two_stage(without_old, metrics)


def test_a_wide_candidates_table_scrolls_in_its_box_not_the_page(tmp_path) -> None:
    from app.upgrades.report_html import render_report_html
    from tests.chromium import render

    # A setting whose value has no space to break at (a grid written out, say).
    settings = {"weights": ";".join(f"{w / 100:.2f}" for w in range(80))}
    candidates = [
        {
            "name": f"candidate-{n}",
            "validation": {"query": {f"recall@{k}": 0.4 for k in (1, 5, 10, 20, 50, 100)}},
            "chosen_settings": settings,
            "eligible": True,
        }
        for n in range(3)
    ]
    job = {"id": "upg_x", "method": "auto", "report": {"candidates": candidates}}
    page = render_report_html(job)
    seen = render(page, tmp_path)
    assert seen["errors"] == [] and seen["width"] <= seen["viewport"] == 1280
    # The same page without the boxes and the wrapping is wider than the window: the check can
    # fail (it did, before both).
    bare = page.replace('<div class="scroll">', "<div>").replace("td{overflow-wrap:anywhere}", "")
    assert render(bare, tmp_path)["width"] > 1280
