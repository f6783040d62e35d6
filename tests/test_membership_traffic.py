"""Issue 42 item 6 on real data: the merge with membership evidence over random and adversarial
re-embedded sets (most clicked, least clicked, one region of the gallery), on the committed
800-synset fixture under the skewed-traffic protocol of ``bench.quality.traffic`` (three seeds:
each its own split, popularity, click log and future searches)."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import pytest
import torch

from bench.common.stats import t_interval
from bench.quality.querydoc import load_arrays
from bench.quality.traffic import FRACTIONS, ORDERS, SEARCHES, run_seed

SEEDS = (0, 1, 2)
INNER = [str(f) for f in FRACTIONS if 0 < f < 1]


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    arrays = load_arrays(True)
    return [run_seed(arrays, seed, "procrustes") for seed in SEEDS]


def _r10(run: dict[str, Any], key: str, fraction: str) -> float:
    return float(run["hits"][key][fraction]["R@10"].astype(float).mean())


def test_orders_that_follow_traffic_gain_from_membership(runs) -> None:
    """Where the re-embedded set follows the click log (the plan, the most clicked first) the
    served merge finds more than the merge that ignores membership, in every seed and fraction
    up to the traffic's coverage (a merge with the lifts at 1 fails this)."""
    for run in runs:
        for search in SEARCHES:
            for order in ("plan", "access"):
                for f in ("0.05", "0.1", "0.25"):
                    served = _r10(run, f"{search}/{order}", f)
                    plain = _r10(run, f"{search}/{order}/plain", f)
                    assert served > plain, (run["seed"], search, order, f, served, plain)


def test_membership_never_costs_beyond_its_interval(runs) -> None:
    """On every order — random, least clicked and one region included — the served merge is
    never below the membership-blind merge beyond the 95 % t interval over the seeds."""
    for search in SEARCHES:
        for order in ORDERS:
            for f in INNER:
                diffs = [
                    _r10(r, f"{search}/{order}", f) - _r10(r, f"{search}/{order}/plain", f)
                    for r in runs
                ]
                _, _, high = t_interval(diffs)
                assert high >= 0.0, (search, order, f, diffs)


def test_sets_that_carry_no_traffic_never_lower_recall_as_they_grow(runs) -> None:
    """Random, least-clicked and one-region sets: re-embedding more (nested sets) never lowers
    R@10 beyond the interval over the seeds. (Sets that follow traffic peak where they cover
    it and fall back to the reindex after: the lift is popularity carried by membership, and at
    100 % it is gone — BENCHMARKS.md, bench.quality.traffic.)"""
    fractions = [str(f) for f in FRACTIONS]
    for search in SEARCHES:
        for order in ("random", "least", "region"):
            for a, b in pairwise(fractions):
                steps = [
                    _r10(r, f"{search}/{order}", b) - _r10(r, f"{search}/{order}", a) for r in runs
                ]
                _, _, high = t_interval(steps)
                assert high >= 0.0, (search, order, a, b, steps)


def test_the_ends_stay_exact_with_membership(runs) -> None:
    """0 % is stay (or the bridge) and 100 % the reindex, query by query, whatever the log."""
    for run in runs:
        assert set(run["max_rank_change_at_ends"].values()) == {0}
        assert np.array_equal(
            run["hits"]["transition/access"]["1.0"]["R@10"], run["hits"]["reindex"]["R@10"]
        )
