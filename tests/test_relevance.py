"""Relevance maps of a merge (app.ml.backfill.relevance) and a transition verdict's expected curve
(app.ml.upgrade.outlook)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.ml.auto.verdict import recommend
from app.ml.backfill.mixed import (
    Candidates,
    calibrated_pair,
    cosine_scores,
    lorentz_scores,
    merge,
    mixed,
    ranks_of,
    reference_fit,
)
from app.ml.backfill.relevance import (
    TIE_WEIGHT,
    RelevanceMap,
    fit_relevance,
    isotonic,
    merge_key,
)
from app.ml.geometry.space import EuclideanLift
from app.ml.upgrade.alternatives import EvalSet
from app.ml.upgrade.data import QueryLog, UpgradeData
from app.ml.upgrade.outlook import transition_outlook
from app.ml.upgrade.run import run_backbone_upgrade


def _brute_isotonic(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit of y (distinct sorted x) by the min–max formula."""
    n = len(y)
    return np.array(
        [max(min(y[i : j + 1].mean() for j in range(k, n)) for i in range(k + 1)) for k in range(n)]
    )


def test_isotonic_is_the_least_squares_monotone_fit() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = np.sort(rng.choice(1000, size=12, replace=False)).astype(float)
        y = rng.random(12)
        xs, ys = isotonic(x, y)
        fitted = np.interp(x, xs, ys)
        assert np.allclose(fitted, _brute_isotonic(y))
        assert np.all(np.diff(xs) > 0) and np.all(np.diff(ys) >= -1e-12)


def test_isotonic_pools_equal_x_and_weights_count() -> None:
    xs, ys = isotonic(np.array([1.0, 1.0, 2.0]), np.array([0.0, 1.0, 0.2]))
    # x = 1 pools to 0.5 > 0.2: one block of mean 0.4 over both distinct x.
    assert np.allclose(ys, [0.4, 0.4]) and np.allclose(xs, [1.0, 2.0])
    _, ys = isotonic(np.array([1.0, 2.0]), np.array([1.0, 0.0]), np.array([3.0, 1.0]))
    assert np.allclose(ys, 0.75)


def test_merge_key_orders_a_list_exactly_as_its_calibrated_score() -> None:
    rng = np.random.default_rng(1)
    c = np.sort(rng.normal(3.0, 2.0, size=500))
    # A step map: equal P̂ over long runs of c, where only the tie term orders.
    relevance = RelevanceMap(
        np.array([0.0, 2.0, 2.0001, 6.0]), np.array([0.1, 0.1, 0.6, 0.6]), 50, 500
    )
    key = merge_key(c, relevance)
    assert np.all(np.diff(key) > 0)
    assert merge_key(np.array([-np.inf]), relevance)[0] == -np.inf
    assert np.array_equal(merge_key(c, None), c)
    assert TIE_WEIGHT < 1e-3


def test_fit_relevance_learns_which_scores_are_relevant() -> None:
    rng = np.random.default_rng(2)
    nq, n = 200, 300
    calibrated = rng.normal(size=(nq, n))
    relevant = [np.array([q % n]) for q in range(nq)]
    # The relevant item scores high: P̂ should rise with c.
    calibrated[np.arange(nq), np.arange(nq) % n] += 4.0
    fitted = fit_relevance(calibrated, relevant)
    assert fitted is not None and fitted.positives == nq
    p = fitted.probability(np.array([-1.0, 2.0, 6.0]))
    assert p[0] < p[1] < p[2] and p[0] >= 0 and p[2] <= 1
    back = RelevanceMap.from_dict(fitted.to_dict())
    assert np.array_equal(back.xs, fitted.xs) and back.positives == fitted.positives
    # Too few relevant items among the candidates: no map (the merge stays on c).
    assert fit_relevance(calibrated[:5], relevant[:5]) is None


def test_a_map_gives_the_better_space_the_say_at_equal_calibrated_score() -> None:
    fit = (np.zeros(1), np.ones(1), np.zeros(1), np.full(1, np.nan))
    native = Candidates(np.array([[1, 2]]), np.array([[3.0, 1.0]]), fit)
    other = Candidates(np.array([[7, 8]]), np.array([[3.2, 1.0]]), fit)
    ids, _, _ = merge(native, other, 3)
    assert ids[0].tolist() == [7, 1, 2]  # on c alone the 3.2 wins; ties go to native
    strong = RelevanceMap(np.array([0.0, 4.0]), np.array([0.2, 0.9]), 40, 100)
    weak = RelevanceMap(np.array([0.0, 4.0]), np.array([0.0, 0.3]), 40, 100)
    ids, keys, native_hit = merge(native, other, 3, (strong, weak))
    assert ids[0].tolist() == [1, 2, 7] and native_hit[0].tolist() == [True, True, False]
    assert np.all(np.diff(keys[0]) <= 0)


def test_a_map_on_one_list_only_is_not_used() -> None:
    """P̂ in [0, 1] on one list against the calibration c on the other would order by scale, not
    by evidence (c of a good hit is several units: the unmapped list always won). With one map
    missing, both lists merge on c, in ``merge`` and in ``calibrated_pair`` alike."""
    fit = (np.zeros(1), np.ones(1), np.zeros(1), np.full(1, np.nan))
    native = Candidates(np.array([[1, 2]]), np.array([[3.0, 1.0]]), fit)
    other = Candidates(np.array([[7, 8]]), np.array([[2.5, 1.0]]), fit)
    strong = RelevanceMap(np.array([0.0, 4.0]), np.array([0.2, 0.9]), 40, 100)
    plain = merge(native, other, 3)
    assert plain[0][0].tolist() == [1, 7, 2]
    for maps in ((strong, None), (None, strong)):
        ids, keys, from_native = merge(native, other, 3, maps)
        assert ids.tolist() == plain[0].tolist() and from_native.tolist() == plain[2].tolist()
        np.testing.assert_array_equal(keys, plain[1])
    scores = (np.array([[3.0, 1.0]]), np.array([[2.5, 1.0]]))
    fits = ((np.zeros(1), np.ones(1), np.zeros(1), np.full(1, np.nan)),) * 2
    expected = calibrated_pair(*scores, fits)
    for maps in ((strong, None), (None, strong)):
        got = calibrated_pair(*scores, fits, maps)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)


def _synthetic(n: int = 400, nq: int = 300, seed: int = 0):
    """Items with a latent meaning; the new model sees it well, the old one through noise."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 16)).astype(np.float32)
    new = z + 0.3 * rng.normal(size=z.shape).astype(np.float32)
    old = z[:, :8] + 0.9 * rng.normal(size=(n, 8)).astype(np.float32)
    rel = rng.integers(0, n, size=nq)
    qz = z[rel] + 0.5 * rng.normal(size=(nq, 16)).astype(np.float32)
    q_new = qz + 0.3 * rng.normal(size=qz.shape).astype(np.float32)
    q_old = qz[:, :8] + 0.9 * rng.normal(size=(nq, 8)).astype(np.float32)
    return new, old, q_new, q_old, [np.array([r]) for r in rel]


def test_the_outlook_runs_from_staying_to_reindexing_and_suggests_a_measurable_share() -> None:
    new, old, q_new, q_old, relevant = _synthetic()
    lift = EuclideanLift()
    old_points = lift(torch.as_tensor(old, dtype=torch.float64)).numpy()
    q_old_points = lift(torch.as_tensor(q_old, dtype=torch.float64)).numpy()
    ev = EvalSet(
        old_points=old_points,
        new_features=new,
        rows=np.arange(len(new)),
        curv=lift.curv,
        query_features=q_new,
        query_old_points=q_old_points,
        query_relevant=relevant,
    )
    outlook = transition_outlook(ev, seed=0)
    assert outlook is not None
    curve = {p["fraction"]: p["value"] for p in outlook["expected"]}
    stay = float(
        (ranks_of(lorentz_scores(q_old_points, old_points, lift.curv), relevant) < 10).mean()
    )
    reindex = float((ranks_of(cosine_scores(q_new, new), relevant) < 10).mean())
    assert reindex > stay + 0.1
    assert curve[0.0] == pytest.approx(stay) and curve[1.0] == pytest.approx(reindex)
    share = outlook["suggested_fraction"]
    assert 0 < share < 1 and curve[share] > stay
    # Chosen on one half of the queries, quoted on the other (issue 42 item 5): the two halves'
    # figures at the share average, weighted, to the curve's.
    split = outlook["split"]
    assert split["chosen_on"] + split["reported_on"] == outlook["queries"]
    assert abs(split["chosen_on"] - split["reported_on"]) <= 1
    weighted = (
        split["chosen_half_expected"] * split["chosen_on"]
        + outlook["expected_at_suggested"] * split["reported_on"]
    ) / outlook["queries"]
    assert weighted == pytest.approx(curve[share])
    gain = outlook["gain_at_suggested"]
    assert gain["low"] < gain["mean"] < gain["high"]
    # Without the old model's query vectors there is no transition to measure.
    no_old = EvalSet(old_points, new, np.arange(len(new)), lift.curv, None, q_new, None, relevant)
    assert transition_outlook(no_old) is None
    # The verdict quotes it.
    metrics = {
        "served": {"query": {"recall@10": stay - 0.05}, "arr": {"query": {"recall@10": 0.5}}},
        "reindex": {"query": {"recall@10": reindex}},
        "stay": {"query": {"recall@10": stay}},
    }
    verdict = recommend(metrics, "served", "query", outlook=outlook)
    assert verdict["action"] == "transition" and verdict["suggested_fraction"] == share
    assert f"first {share:.0%}" in verdict["next_step"]


def test_a_transition_verdict_of_an_upgrade_carries_its_share_and_figure(monkeypatch) -> None:
    """Where two-stage search has no evidence (no curve measured), a new model that beats the
    old one and a bridge that does not give a transition verdict with its share and figure."""
    from app.ml.upgrade import pipeline

    new, old, q_new, q_old, relevant = _synthetic(n=500, nq=500, seed=3)
    data = UpgradeData(new, old, None, QueryLog(q_new, q_old, relevant))
    with_two_stage = run_backbone_upgrade("procrustes", data, EuclideanLift(), eval_fraction=0.4)
    # With the curve measured, two stages beat staying here by far: that is the verdict.
    first = with_two_stage.report["recommendation"]
    assert first["action"] == "two-stage", first["why"]
    assert first["two_stage"]["depth"] == with_two_stage.report["two_stage"]["default_depth"]
    gain = first["two_stage"]["gain"]
    assert gain["mean"] > 2 * gain["se"] > 0
    assert "--rerank-depth" in first["next_step"]
    monkeypatch.setattr(pipeline, "two_stage_curve", lambda *args, **kwargs: None)
    out = run_backbone_upgrade("procrustes", data, EuclideanLift(), eval_fraction=0.4)
    rec = out.report["recommendation"]
    assert rec["action"] == "transition", rec["why"]
    assert 0 < rec["suggested_fraction"] <= 1
    curve = {p["fraction"]: p["value"] for p in rec["expected"]}
    assert curve[0.0] == pytest.approx(rec["endpoints"]["at_0"], abs=0.05)
    # Quoted on the half of the held-out queries the choice did not see.
    split = rec["split"]
    weighted = (
        split["chosen_half_expected"] * split["chosen_on"]
        + rec["expected_at_suggested"] * split["reported_on"]
    ) / (split["chosen_on"] + split["reported_on"])
    assert weighted == pytest.approx(curve[rec["suggested_fraction"]])


def test_transition_keys_keep_both_ends_exact_with_maps() -> None:
    new, old, q_new, q_old, relevant = _synthetic(seed=4)
    lift = EuclideanLift()
    old_points = lift(torch.as_tensor(old, dtype=torch.float64)).numpy()
    q_points = lift(torch.as_tensor(q_old, dtype=torch.float64)).numpy()
    native = cosine_scores(q_new, new)
    other = lorentz_scores(q_points, old_points, lift.curv)
    fits = (reference_fit(native, end=1.0), reference_fit(other, end=-1.0 / lift.curv))
    maps = (
        RelevanceMap(np.array([0.0, 5.0]), np.array([0.0, 0.9]), 99, 100),
        RelevanceMap(np.array([0.0, 5.0]), np.array([0.0, 0.2]), 99, 100),
    )
    keys = calibrated_pair(native, other, fits, maps)
    n = len(new)
    none, every = np.zeros(n, bool), np.ones(n, bool)
    assert np.array_equal(ranks_of(mixed(*keys, none), relevant), ranks_of(other, relevant))
    assert np.array_equal(ranks_of(mixed(*keys, every), relevant), ranks_of(native, relevant))
