"""Issue 42 item 6: a merge that knows where its items come from (app.ml.backfill.membership)."""

from __future__ import annotations

import numpy as np
import pytest

from app.ml.backfill.membership import (
    NO_LIFTS,
    ClickSummary,
    coverage,
    lifted_keys,
    membership_lifts,
)
from app.ml.backfill.mixed import Candidates, merge, mixed


def _zipf_clicks(n: int, searches: int, rng: np.random.Generator) -> np.ndarray:
    weights = (rng.permutation(n) + 1.0) ** -1.0
    clicked = rng.choice(n, size=searches, p=weights / weights.sum())
    return np.bincount(clicked, minlength=n)


def test_no_log_no_lift() -> None:
    assert membership_lifts(None) == NO_LIFTS
    mask = np.zeros(100, dtype=bool)
    mask[:10] = True
    assert membership_lifts(ClickSummary.of(np.zeros(100, dtype=np.int64), mask)) == NO_LIFTS
    assert coverage(ClickSummary.of(np.zeros(100, dtype=np.int64), mask)) is None


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_nothing_or_everything_reembedded_is_never_lifted(share: float) -> None:
    """0 % and 100 % must stay the one-space rankings exactly."""
    clicks = _zipf_clicks(1000, 5000, np.random.default_rng(0))
    mask = np.full(1000, share == 1.0)
    assert membership_lifts(ClickSummary.of(clicks, mask)) == NO_LIFTS


def test_singleton_log_is_no_evidence() -> None:
    """Every search wanted a new item (uniform traffic): the clicked items are no likelier than
    any other, so re-embedding exactly them earns no lift."""
    n = 24_000
    clicks = np.zeros(n, dtype=np.int64)
    clicks[:1000] = 1
    mask = clicks > 0
    lifts = membership_lifts(ClickSummary.of(clicks, mask))
    assert lifts == pytest.approx((1.0, 1.0))


def test_coverage_predicts_the_future_for_random_sets() -> None:
    """A random R under skewed traffic holds what its clicks say (its lift is not 1 when it
    happens to hold a popular item): π̂ is within a few points of the share of fresh searches
    whose item is in R, for random sets of several sizes."""
    rng = np.random.default_rng(1)
    n = 50_000
    weights = (rng.permutation(n) + 1.0) ** -1.0
    weights /= weights.sum()
    past = np.bincount(rng.choice(n, size=100_000, p=weights), minlength=n)
    future = rng.choice(n, size=100_000, p=weights)
    for share in (0.05, 0.1, 0.25, 0.5):
        mask = rng.random(n) < share
        assert coverage(ClickSummary.of(past, mask)) == pytest.approx(mask[future].mean(), abs=0.03)


def test_most_clicked_set_is_lifted_but_not_to_certainty() -> None:
    """R = every clicked item: the log's clicked mass (1 − the missing mass) plus R's uniform
    share of the rest, not 1, and its future coverage is what that predicts."""
    rng = np.random.default_rng(2)
    n = 24_000
    weights = (rng.permutation(n) + 1.0) ** -1.0
    weights /= weights.sum()
    past = np.bincount(rng.choice(n, size=8000, p=weights), minlength=n)
    mask = past > 0
    summary = ClickSummary.of(past, mask)
    pi = coverage(summary)
    missing = summary.singletons / summary.clicks
    share = mask.mean()
    assert pi == pytest.approx(1 - missing + missing * share)
    future = rng.choice(n, size=20_000, p=weights)
    assert pi == pytest.approx(mask[future].mean(), abs=0.05)
    native, other = membership_lifts(summary)
    assert native > 5 and 0 < other < 0.5


def test_least_clicked_set_is_lowered() -> None:
    rng = np.random.default_rng(3)
    clicks = _zipf_clicks(10_000, 20_000, rng)
    mask = clicks == 0
    native, other = membership_lifts(ClickSummary.of(clicks, mask))
    assert native < 1 < other


@pytest.mark.parametrize("probability", [True, False])
def test_lifted_keys_keep_each_lists_order(probability: bool) -> None:
    rng = np.random.default_rng(4)
    keys = rng.random((5, 50)) if probability else rng.normal(3, 2, (5, 50))
    keys[:, -1] = -np.inf
    for lift in (1e-9, 0.01, 0.5, 2.0, 300.0):
        out = lifted_keys(keys, lift, probability)
        assert np.isneginf(out[:, -1]).all()
        assert (np.argsort(out[:, :-1], axis=1) == np.argsort(keys[:, :-1], axis=1)).all()
    # The odds scale: P̂ = 0.5 with lift 3 is 0.75; c shifts by ln L.
    if probability:
        assert lifted_keys(np.array([0.5]), 3.0, True)[0] == pytest.approx(0.75)
    else:
        assert lifted_keys(np.array([2.0]), np.e, False)[0] == pytest.approx(3.0)


def test_a_lift_moves_items_between_lists_not_within() -> None:
    """An item of the lifted list overtakes the other list's item it trailed; the two lists' own
    orders are untouched, and with (1, 1) the merge is the one before issue 42 item 6."""
    fit = (np.zeros(1), np.ones(1), np.zeros(1), np.full(1, np.nan))
    native = Candidates(np.array([[1, 2]]), np.array([[-1.0, -2.0]]), fit)
    other = Candidates(np.array([[3, 4]]), np.array([[-0.5, -3.0]]), fit)
    ids, _, _ = merge(native, other, 4)
    assert ids.tolist() == [[3, 1, 2, 4]]
    ids, _, _ = merge(native, other, 4, lifts=(np.e, 1.0))
    assert ids.tolist() == [[1, 3, 2, 4]]
    ids, _, _ = merge(native, other, 4, lifts=(1.0, 1.0))
    assert ids.tolist() == [[3, 1, 2, 4]]


def test_mixed_with_lifts_matches_merge_rule() -> None:
    rng = np.random.default_rng(5)
    cal_native = rng.random((3, 20))
    cal_bridged = rng.random((3, 20))
    mask = rng.random(20) < 0.3
    lifted = mixed(cal_native, cal_bridged, mask, lifts=(4.0, 0.5), probability=True)
    expect = np.where(
        mask[None, :], lifted_keys(cal_native, 4.0, True), lifted_keys(cal_bridged, 0.5, True)
    )
    assert np.allclose(lifted, expect)
    assert np.array_equal(
        mixed(cal_native, cal_bridged, mask), mixed(cal_native, cal_bridged, mask, lifts=NO_LIFTS)
    )
