"""The plan's traffic-weighted order, its comparison with random, and the note on a falling
expected curve (``app.ml.backfill.traffic``)."""

from __future__ import annotations

import numpy as np

from app.ml.backfill.traffic import (
    expected_note,
    no_better_warning,
    traffic_share,
    value_order,
    versus_random,
)


def test_clicked_items_come_first_and_gain_orders_the_rest() -> None:
    gain = np.array([0.9, 0.1, 0.5, 0.8, 0.2, 0.3])
    counts = np.array([0, 50, 0, 0, 1, 0])
    for validated in (True, False):
        order = value_order(gain, counts, validated).tolist()
        # 50 clicks, then 1 click, then the unclicked by gain.
        assert order == [1, 4, 0, 3, 2, 5], validated
    # Excluded (already re-embedded) items are left out.
    assert value_order(gain, counts, True, np.array([0, 1, 0, 0, 0, 0], bool)).tolist() == [
        4,
        0,
        3,
        2,
        5,
    ]


def test_a_validated_gain_reorders_similar_traffic_but_not_far_apart() -> None:
    gain = np.array([0.0, 1.0, 0.5])
    counts = np.array([10, 9, 40])
    assert value_order(gain, counts, True).tolist() == [2, 1, 0]
    # Unvalidated, the gain only breaks ties: counts decide.
    assert value_order(gain, counts, False).tolist() == [2, 0, 1]
    share = traffic_share(np.array([0, 1, 3]))
    assert np.isclose(share.sum(), 1.0) and share[0] > 0 and np.isclose(share[1], 3 * share[0])


def _validation(learned: list[float], random: list[float], queries: int) -> dict:
    fractions = [0.0, 0.25, 0.5, 1.0]
    curve = lambda ys: [{"fraction": f, "recall@10": y} for f, y in zip(fractions, ys, strict=True)]  # noqa: E731
    areas = {
        name: float(np.trapezoid(ys, fractions))
        for name, ys in (("expected_gain", learned), ("random", random))
    }
    return {
        "area": areas,
        "curves": {"expected_gain": curve(learned), "random": curve(random)},
        "chosen": "expected_gain",
        "queries": queries,
    }


def test_versus_random_and_its_warning() -> None:
    flat = versus_random(_validation([0.5, 0.52, 0.55, 0.6], [0.5, 0.52, 0.55, 0.6], 400), 0.25)
    assert flat is not None and flat["better"] is False and flat["area"] == 0.0
    assert "no better than random" in no_better_warning(flat, with_traffic=False)
    assert "access counts" in no_better_warning(flat, with_traffic=True)
    clear = versus_random(_validation([0.5, 0.7, 0.8, 0.8], [0.5, 0.55, 0.65, 0.8], 2000), 0.25)
    assert clear is not None and clear["better"] is True
    assert abs(clear["at_fraction"] - 0.15) < 1e-9
    assert no_better_warning(clear, with_traffic=False) is None
    assert versus_random({}, 0.1) is None  # a fit stored without curves


def test_expected_note_explains_a_fall_and_stays_quiet_otherwise() -> None:
    rising = [
        {"fraction": f, "metric": "recall@1", "value": v}
        for f, v in ((0.0, 0.5), (0.25, 0.6), (1.0, 0.7))
    ]
    assert expected_note(rising, 400) is None
    falling = [
        {"fraction": f, "metric": "recall@1", "value": v}
        for f, v in ((0.0, 0.9915), (0.25, 0.978), (1.0, 1.0))
    ]
    note = expected_note(falling, 4000)
    assert note is not None and "recall@1 falls from 0.9915 at 0.0% to 0.9780 at 25.0%" in note
    assert "more than the held-out noise" in note
    assert "within the held-out noise" in expected_note(falling, 10)
