"""The plan's choice of traffic estimate (``app.ml.backfill.traffic_model``): each extra signal is
taken when, and only when, it predicts held-out clicks better than the counts alone."""

from __future__ import annotations

import numpy as np
import pytest

from app.ml.backfill.traffic_model import (
    MIN_CLICKS,
    Neighbourhood,
    choose_traffic,
    covered,
    estimate,
    heavy_items,
    nearest_others,
    neighbourhood_traffic,
)

ITEMS = 4000
CLUSTER = 10


def _clustered_rates(rng: np.random.Generator) -> np.ndarray:
    """Popularity that follows topics: Zipf over clusters of CLUSTER items, even within one."""
    clusters = ITEMS // CLUSTER
    zipf = 1.0 / np.arange(1, clusters + 1)
    per_cluster = zipf[rng.permutation(clusters)]
    return np.repeat(per_cluster, CLUSTER) / CLUSTER


def _cluster_hood(counts: np.ndarray, heavy: int = 256) -> Neighbourhood:
    """Each heavily clicked item's neighbours: the other members of its cluster."""
    sources = np.argsort(-counts, kind="stable")[:heavy]
    base = (sources // CLUSTER) * CLUSTER
    members = base[:, None] + np.arange(CLUSTER)[None, :]
    neighbours = np.where(members == sources[:, None], -1, members)
    return Neighbourhood(sources, neighbours)


def _clicks(rates: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    return rng.poisson(rates / rates.sum() * total)


def test_neighbourhood_traffic_spreads_each_heavy_items_clicks_over_its_neighbours() -> None:
    counts = np.array([6, 0, 0, 3, 0])
    hood = Neighbourhood(np.array([0, 3]), np.array([[1, 2, -1], [1, -1, -1]]))
    assert neighbourhood_traffic(counts, hood).tolist() == [0.0, 3.0 + 3.0, 3.0, 0.0, 0.0]


def test_estimate_puts_the_returned_tally_in_click_units() -> None:
    counts = np.array([2, 2, 0, 0])
    returned = np.array([0.0, 0.0, 1.0, 3.0])
    assert estimate(counts, returned, None, 1.0, 0.0).tolist() == [2.0, 2.0, 1.0, 3.0]
    assert estimate(counts, returned, None, 0.0, 0.0).tolist() == [2.0, 2.0, 0.0, 0.0]


def test_covered_is_the_future_share_of_the_top_allowed_items() -> None:
    values = np.array([5.0, 4.0, 3.0, 2.0])
    future = np.array([1, 1, 6, 2])
    allowed = np.array([False, True, True, True])
    tiebreak = np.zeros(4)
    assert covered(values, future, allowed, 2, tiebreak) == 0.7
    assert covered(values, future, allowed, 10, tiebreak) == 0.9


def test_neighbourhood_is_chosen_when_popularity_follows_topics() -> None:
    rng = np.random.default_rng(1)
    rates = _clustered_rates(rng)
    counts = _clicks(rates, 3000, rng)
    choice = choose_traffic(
        counts, None, _cluster_hood(counts), np.zeros(ITEMS, bool), 200, np.zeros(ITEMS)
    )
    assert "neighbourhood" in choice.signals, choice.report
    # And it pays on clicks that were never seen: more of a fresh draw of traffic is covered.
    fresh = _clicks(rates, 30000, np.random.default_rng(2))
    allowed = np.ones(ITEMS, bool)
    ties = np.zeros(ITEMS)
    assert covered(choice.estimate, fresh, allowed, 200, ties) > covered(
        counts.astype(float), fresh, allowed, 200, ties
    )


def test_counts_alone_are_kept_when_neighbours_share_no_popularity() -> None:
    rng = np.random.default_rng(3)
    rates = _clustered_rates(rng)[rng.permutation(ITEMS)]  # popularity no longer by cluster
    counts = _clicks(rates, 3000, rng)
    choice = choose_traffic(
        counts, None, _cluster_hood(counts), np.zeros(ITEMS, bool), 200, np.zeros(ITEMS)
    )
    assert choice.signals == ["access_counts"], choice.report
    assert choice.estimate.tolist() == counts.astype(float).tolist()
    names = [c["name"] for c in choice.report["candidates"]]
    assert names[0] == "access_counts" and len(names) == 4


def test_an_informative_returned_tally_is_taken_and_a_noisy_one_is_not() -> None:
    rng = np.random.default_rng(4)
    rates = _clustered_rates(rng)[rng.permutation(ITEMS)]
    counts = _clicks(rates, 1500, rng)
    informative = rates * rng.uniform(0.8, 1.2, ITEMS)
    noisy = rng.uniform(0.0, 1.0, ITEMS)
    excluded = np.zeros(ITEMS, bool)
    taken = choose_traffic(counts, informative, None, excluded, 300, np.zeros(ITEMS))
    assert "search_returned" in taken.signals, taken.report
    kept = choose_traffic(counts, noisy, None, excluded, 300, np.zeros(ITEMS))
    assert kept.signals == ["access_counts"], kept.report


def test_too_few_clicks_are_not_validated_and_the_choice_is_deterministic() -> None:
    rng = np.random.default_rng(5)
    counts = np.zeros(ITEMS, dtype=np.int64)
    counts[rng.choice(ITEMS, MIN_CLICKS - 1, replace=False)] = 1
    returned = rng.uniform(0, 1, ITEMS)
    thin = choose_traffic(counts, returned, None, np.zeros(ITEMS, bool), 50, np.zeros(ITEMS))
    assert thin.signals == ["access_counts"] and "not validated" in thin.report["note"]
    rates = _clustered_rates(rng)
    many = _clicks(rates, 3000, rng)
    hood = _cluster_hood(many)
    first = choose_traffic(many, returned, hood, np.zeros(ITEMS, bool), 100, np.zeros(ITEMS))
    again = choose_traffic(many, returned, hood, np.zeros(ITEMS, bool), 100, np.zeros(ITEMS))
    assert first.name == again.name and first.report == again.report


def test_nearest_others_leave_the_item_itself_out() -> None:
    sources = np.array([3, 8])
    found = np.array([[3, 5, 6], [2, 8, -1]])
    hood = nearest_others(sources, found)
    assert hood.neighbours[:, :2].tolist() == [[5, 6], [2, -1]]
    counts = np.array([0, 4, 0, 9, 0, 1, 0, 0, 2])
    assert heavy_items(counts).tolist() == [3, 1, 8, 5]


def test_a_gain_on_every_split_but_within_the_noise_is_not_taken(monkeypatch) -> None:
    """The rule itself: consistent but smaller than one standard error of the held-out share
    (here √(0.5·0.5/500) ≈ 0.022) keeps the counts alone; a gain beyond it is taken."""
    from app.ml.backfill import traffic_model

    counts = np.full(1000, 1, dtype=np.int64)  # 1000 clicks: 500 in a future half
    returned = np.linspace(0.0, 1.0, 1000)
    for gain, taken in ((0.01, False), (0.05, True)):

        def fake_covered(values, future, allowed, n, tiebreak, gain=gain):
            # 0.5 for the counts alone (their estimate has no fractional part), more otherwise.
            return 0.5 if np.array_equal(values, np.round(values)) else 0.5 + gain

        monkeypatch.setattr(traffic_model, "covered", fake_covered)
        choice = choose_traffic(counts, returned, None, np.zeros(1000, bool), 100, np.zeros(1000))
        assert choice.report["margin"] == pytest.approx(0.5 / np.sqrt(500))
        assert ("search_returned" in choice.signals) is taken, choice.report
