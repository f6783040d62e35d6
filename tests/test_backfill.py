"""The partial-backfill core: the calibrated merge of native and bridged lists, the plan, and the
bench's smoke run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from app.ml.backfill.mixed import (
    Candidates,
    calibrate,
    merge,
    merged_ranks,
    mixed,
    ranks_of,
    reference_fit,
    tail_fit,
    top_of,
)
from app.ml.backfill.plan import FitView, fit_planner, plan_order
from app.ml.geometry.space import EuclideanLift
from app.ml.upgrade.fit_view import (
    bridged_reference_fit,
    cosine_scores,
    lorentz_scores,
    native_reference_fit,
)


def lists(rng, nq=5, n=300):
    native, bridged = rng.normal(size=(nq, n)), rng.normal(size=(nq, n))
    fits = (reference_fit(rng.normal(size=(nq, 200))), reference_fit(rng.normal(size=(nq, 200))))
    return native, bridged, fits


def test_all_or_nothing_reembedded_keeps_each_spaces_own_order() -> None:
    rng = np.random.default_rng(0)
    native, bridged, fits = lists(rng)
    rel = [np.array([i]) for i in range(5)]
    for mask, scores in ((np.ones(300, bool), native), (np.zeros(300, bool), bridged)):
        ranks = merged_ranks(native, bridged, mask, rel, fits)
        expected = [(scores[q] > scores[q, q]).sum() for q in range(5)]
        assert ranks.tolist() == expected


def test_calibration_ignores_the_scale_of_a_space() -> None:
    """An affine change of one space's scores (another metric, a cosine vs an inner product)
    changes nothing: the tail is fitted per query on the same scale."""
    rng = np.random.default_rng(1)
    ref, s = rng.normal(size=(3, 500)), rng.normal(size=(3, 20))
    a = calibrate(s, reference_fit(ref))
    b = calibrate(3.0 * s - 7.0, reference_fit(3.0 * ref - 7.0))
    np.testing.assert_allclose(a, b, atol=1e-9)


def test_the_tail_estimates_the_share_above() -> None:
    """For exponential scores, exp(−c) estimates the share of the population above a score."""
    rng = np.random.default_rng(2)
    population = rng.exponential(size=(1, 20000))
    _, top = top_of(population, 101)
    fit = tail_fit(top, 20000)
    for share in (0.001, 0.003):
        s = np.quantile(population, 1 - share)
        assert abs(np.exp(-calibrate(np.array([[s]]), fit))[0, 0] / share - 1) < 0.3


def test_merge_interleaves_by_calibrated_score_and_pads() -> None:
    fit_same = reference_fit(np.linspace(0, 1, 300)[None, :])
    native = Candidates(np.array([[10, 11]]), np.array([[0.99, 0.5]]), fit_same)
    bridged = Candidates(np.array([[20, -1]]), np.array([[0.8, -np.inf]]), fit_same)
    ids, scores, native_mask = merge(native, bridged, 4)
    assert ids.tolist() == [[10, 20, 11, -1]]
    assert native_mask.tolist() == [[True, False, True, False]]
    assert np.all(np.diff(scores[0, :3]) < 0)


def test_an_item_reembedded_with_the_querys_own_features_ranks_first_in_low_dimensions() -> None:
    """Bug: on 6-d data the exponential tail gave cos = 1 a finite, modest calibrated score (a
    cosine's tail ends at 1, an exponential has no end), so a bridged item that merely scored
    well above its own tail outranked the exact match. Searched as the service does: native
    cosines, bridged Lorentz scores of a least-squares bridge, tails from reference items."""
    rng = np.random.default_rng(0)
    n, d = 400, 6
    old = rng.normal(size=(n, d))
    rotation = np.linalg.qr(rng.normal(size=(d, d)))[0]
    new = old @ rotation + 0.3 * rng.normal(size=(n, d))
    lift = EuclideanLift()
    points = lift(torch.as_tensor(old)).numpy().astype(np.float32)
    bridge = np.linalg.lstsq(new, old, rcond=None)[0]
    query_points = lift(torch.as_tensor(new @ bridge)).numpy().astype(np.float32)
    reference = rng.choice(n, 200, replace=False)
    fits = (
        native_reference_fit(new, new[reference]),
        bridged_reference_fit(query_points, points[reference], lift.curv),
    )
    native = cosine_scores(new, new)
    bridged = lorentz_scores(query_points, points, lift.curv)
    reembedded = rng.random(n) < 0.25
    rows = np.flatnonzero(reembedded)
    ranks = merged_ranks(
        native[rows],
        bridged[rows],
        reembedded,
        [np.array([i]) for i in rows],
        tuple(tuple(a[rows] for a in fit) for fit in fits),
    )
    assert ranks.tolist() == [0] * len(rows)


def test_merge_rules_score_only_the_reembedded_items_differently() -> None:
    cal_native = np.array([[3.0, 1.0, 2.0]])
    cal_bridged = np.array([[1.0, 4.0, 0.5]])
    reembedded = np.array([True, True, False])
    assert mixed(cal_native, cal_bridged, reembedded, "native").tolist() == [[3.0, 1.0, 0.5]]
    assert mixed(cal_native, cal_bridged, reembedded, "max").tolist() == [[3.0, 4.0, 0.5]]
    assert mixed(cal_native, cal_bridged, reembedded, "mean").tolist() == [[2.0, 2.5, 0.5]]
    with pytest.raises(ValueError, match="merge rule"):
        mixed(cal_native, cal_bridged, reembedded, "sum")
    assert ranks_of(mixed(cal_native, cal_bridged, reembedded, "max"), [np.array([0, 2])]) == [1]


def test_plan_order_leaves_out_the_reembedded() -> None:
    order = plan_order(np.array([0.1, 0.9, 0.5, 0.7]), np.array([False, True, False, False]))
    assert order.tolist() == [3, 2, 0]


def test_the_planner_learns_a_gain_that_depends_on_the_old_point() -> None:
    """Items whose first old coordinate is high are bridged badly (their relevant score drops):
    the learned estimator finds them, beats random order, and says so."""
    rng = np.random.default_rng(3)
    n, d = 400, 8
    old = rng.normal(size=(n, d)).astype(np.float32)
    hard = old[:, 0] > 0.5
    native = rng.normal(size=(n, n)).astype(np.float32)
    native[np.arange(n), np.arange(n)] += 4.0
    bridged = rng.normal(size=(n, n)).astype(np.float32)
    bridged[np.arange(n), np.arange(n)] += np.where(hard, 0.0, 4.0)
    held = np.arange(0, n, 2)
    ref = np.arange(1, n, 2)
    view = FitView(
        native=native[held],
        bridged=bridged[held],
        relevant=[np.array([i]) for i in held],
        old_points=old,
        held_out=held,
        view="query",
        fits=(reference_fit(native[held][:, ref]), reference_fit(bridged[held][:, ref])),
    )
    fit = fit_planner(view)
    assert fit.estimator == "expected_gain"
    assert fit.validation["gain_correlation"] > 0.5
    assert fit.validation["area"]["expected_gain"] > fit.validation["area"]["random"]
    value = {(p["fraction"], p["metric"]): p["value"] for p in fit.expected}
    assert value[(1.0, "recall@1")] > value[(0.0, "recall@1")]
    predicted = fit.gain_model.predict(old)
    assert predicted[hard].mean() > predicted[~hard].mean()


def test_bench_quick(tmp_path) -> None:
    from bench.quality.backfill import main

    out = main(["--quick", "--out", str(tmp_path / "backfill.json")])
    payload = json.loads(out.read_text())
    assert (tmp_path / "backfill.png").exists()
    summary = payload["summary"]
    # At 100 % every order is the new backbone's own search; at 0 % the bridge's.
    full = {summary[o]["1.0"]["query R@10"][0] for o in summary}
    none = {summary[o]["0.0"]["query R@10"][0] for o in summary}
    assert len(full) == 1 and len(none) == 1
    assert summary["oracle"]["0.25"]["query R@10"][0] >= summary["random"]["0.25"]["query R@10"][0]
    assert payload["plan_seconds_1m"] < 10


class _CountingIndex:
    """Items 0..n−1 at distance |id − 10·query| (query rows are numbers), counting searches."""

    def __init__(self, n: int) -> None:
        self.ntotal = n
        self.searched: list[tuple[int, int]] = []

    def search_with_points(self, queries, k, *, overfetch, min_candidates):
        self.searched.append((len(queries), k))
        centres = np.asarray(queries, dtype=np.float64)[:, 0] * 10
        dist = np.abs(np.arange(self.ntotal)[None, :] - centres[:, None])
        order = np.argsort(dist, axis=1, kind="stable")[:, :k]
        return order, np.take_along_axis(dist, order, axis=1), None


def test_the_other_list_fetches_again_only_for_the_queries_short_of_k() -> None:
    from app.migration.reembed import _without_reembedded

    index = _CountingIndex(200)
    # Query 0 sits among 30 re-embedded items (ids 0–29); query 1 far from them.
    reembedded = np.arange(30)
    queries = np.array([[1.0], [15.0]])
    ids, dist = _without_reembedded(index, queries, reembedded, 5, 4, 64)
    assert index.searched[0] == (2, 10) and index.searched[1:] == [(1, 40)]
    assert ids[0].tolist() == [30, 31, 32, 33, 34] and not np.isin(ids, reembedded).any()
    assert ids[1].tolist() == [150, 149, 151, 148, 152]
    assert np.all(np.diff(dist, axis=1) >= 0)
    # Fewer items left than k: padded, and the search stops at the whole gallery.
    small = _CountingIndex(8)
    ids, dist = _without_reembedded(small, np.array([[0.0]]), np.arange(6), 5, 4, 64)
    assert ids[0].tolist()[:2] == [6, 7] and ids[0, 2:].tolist() == [-1, -1, -1]
    assert np.isinf(dist[0, 2:]).all() and small.searched[-1][1] == 8
