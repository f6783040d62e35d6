"""An upgrade's held-out query figures search the whole gallery (issue 44 item 2): every stored
item a distractor, the items without new features in the old space.

The gallery is the fixture's 800 old glosses; the dataset pairs a seeded 500 of them with their
new glosses, the other 300 are given as ``distractors`` (the gallery's items without dataset
features). The figures are checked against independent numpy searches of the same held-out
queries over all 800 items."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.ml.backfill.plan import fit_planner
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.training import NO_HOOKS
from app.ml.upgrade.data import split_for_evaluation, split_queries
from app.ml.upgrade.fit_view import build_fit_view
from app.ml.upgrade.outlook import transition_outlook
from app.ml.upgrade.pipeline import UpgradeContext
from app.ml.upgrade.run import QueryLog, UpgradeData, run_backbone_upgrade
from app.ml.upgrade.whole_gallery import describe
from bench.common.wordnet import NEW_MODEL, OLD_MODEL

SEED = 0
EVAL_FRACTION = 0.4
N_PAIRED = 500


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _gallery(wordnet_small: dict) -> tuple[UpgradeData, np.ndarray]:
    """(the upgrade's data, gallery position of each paired row): paired rows first in the
    gallery, then the distractors, each in fixture order."""
    n = len(wordnet_small["synset_id"])
    paired = np.sort(np.random.default_rng(7).permutation(n)[:N_PAIRED])
    unpaired = np.setdiff1d(np.arange(n), paired)
    queries = QueryLog(
        features=wordnet_small[f"lemma.{NEW_MODEL}"][paired],
        old_vectors=wordnet_small[f"lemma.{OLD_MODEL}"][paired],
        relevant=[np.array([i]) for i in range(N_PAIRED)],
    )
    data = UpgradeData(
        wordnet_small[f"gloss.{NEW_MODEL}"][paired],
        wordnet_small[f"gloss.{OLD_MODEL}"][paired],
        None,
        queries,
        distractors=wordnet_small[f"gloss.{OLD_MODEL}"][unpaired],
    )
    return data, np.concatenate([paired, unpaired])


def _held_out_queries(data: UpgradeData) -> np.ndarray:
    _, eval_idx = split_for_evaluation(len(data), EVAL_FRACTION, SEED)
    _, eval_q = split_queries(data.queries, eval_idx, EVAL_FRACTION, SEED)
    return eval_q


def _recall10(scores: np.ndarray, relevant: np.ndarray) -> float:
    """Share of queries whose relevant column is among the 10 best (ties counted against)."""
    own = scores[np.arange(len(relevant)), relevant]
    return float(((scores >= own[:, None]).sum(axis=1) <= 10).mean())


@pytest.fixture(scope="module")
def upgrade(wordnet_small):
    data, _ = _gallery(wordnet_small)
    out = run_backbone_upgrade(
        "procrustes",
        data,
        EuclideanLift(),
        seed=SEED,
        eval_fraction=EVAL_FRACTION,
        objective="query",
    )
    return data, out


def test_stay_searches_every_stored_item(wordnet_small, upgrade) -> None:
    data, out = upgrade
    eval_q = _held_out_queries(data)
    # Independent: the old lemma vectors against every old gloss vector by cosine (a cosine
    # gallery's Lorentz order), the query's own paired row relevant.
    gallery = _unit(np.concatenate([data.old_vectors, data.distractors]))
    scores = _unit(data.queries.old_vectors[eval_q]) @ gallery.T
    stay = _recall10(scores, eval_q)
    paired_only = _recall10(scores[:, :N_PAIRED], eval_q)
    assert paired_only > stay + 0.01  # the 300 distractors matter on this fixture
    report = out.report
    assert report["metrics"]["stay"]["query"]["recall@10"] == pytest.approx(stay, abs=0.005)
    searched = report["searched"]
    assert (searched["paired_items"], searched["unpaired_items"]) == (500, 300)
    assert searched["query"]["items"] == 800


def test_the_bridge_searches_every_stored_item(wordnet_small, upgrade) -> None:
    data, out = upgrade
    eval_q = _held_out_queries(data)
    lift = EuclideanLift()
    points = lift(torch.from_numpy(np.concatenate([data.old_vectors, data.distractors])))
    x = points.numpy().astype(np.float64)
    q = out.model.embed(data.queries.features[eval_q]).astype(np.float64)
    c = lift.curv
    # ⟨q, x⟩_L = q·x − q₀x₀: larger is nearer.
    scores = q @ x.T - np.outer(np.sqrt(1 / c + (q * q).sum(1)), np.sqrt(1 / c + (x * x).sum(1)))
    bridge = _recall10(scores, eval_q)
    assert _recall10(scores[:, :N_PAIRED], eval_q) > bridge + 0.01
    got = out.report["metrics"]["procrustes"]["query"]["recall@10"]
    assert got == pytest.approx(bridge, abs=0.005)


def test_reindex_is_the_paired_items_reembedded_the_rest_old(wordnet_small, upgrade) -> None:
    """Reindex cannot score the items without new features natively: they stay in the old space,
    merged as the transition search merges them, and the report says so. With every item's
    new features (the fixture has them) a true reindex is the figure's upper reference."""
    data, out = upgrade
    metrics = out.report["metrics"]
    reindex = metrics["reindex"]["query"]["recall@10"]
    assert "old space" in out.report["searched"]["query"]["reindex"]
    eval_q = _held_out_queries(data)
    _, order = _gallery(wordnet_small)
    every_new = _unit(wordnet_small[f"gloss.{NEW_MODEL}"][order])
    true_reindex = _recall10(_unit(data.queries.features[eval_q]) @ every_new.T, eval_q)
    assert metrics["stay"]["query"]["recall@10"] < reindex <= true_reindex + 0.03
    # The transition curve ends at that figure: 100 % is every paired item re-embedded.
    ctx = UpgradeContext.build(data, EuclideanLift(), SEED, NO_HOOKS)
    _, eval_idx = split_for_evaluation(len(data), EVAL_FRACTION, SEED)
    ev = ctx.whole_gallery(ctx.eval_set(np.arange(len(data)), eval_idx, eval_q))
    outlook = transition_outlook(ev, SEED)
    assert outlook is not None
    curve = {p["fraction"]: p["value"] for p in outlook["expected"]}
    assert curve[1.0] == pytest.approx(reindex, abs=1e-9)
    assert curve[0.0] == pytest.approx(metrics["stay"]["query"]["recall@10"], abs=0.005)
    assert outlook["searched"]["items"] == 800


def test_the_backfill_fit_searches_every_stored_item(wordnet_small, upgrade) -> None:
    """The plan's curves and gallery get's "now" come from the fit: at 0 % re-embedded its
    transition search is staying, over the whole gallery."""
    data, out = upgrade
    _, eval_idx = split_for_evaluation(len(data), EVAL_FRACTION, SEED)
    eval_q = _held_out_queries(data)
    view = build_fit_view(out.model, data, EuclideanLift(), eval_idx, eval_q, SEED)
    fit = fit_planner(view, SEED)
    assert fit.transition is not None
    at_zero = next(
        p["value"] for p in fit.transition if p["fraction"] == 0.0 and p["metric"] == "recall@10"
    )
    gallery = _unit(np.concatenate([data.old_vectors, data.distractors]))
    stay = _recall10(_unit(data.queries.old_vectors[eval_q]) @ gallery.T, eval_q)
    assert at_zero == pytest.approx(stay, abs=0.005)
    assert fit.validation["searched"]["items"] == 800


def test_without_old_query_vectors_the_bridge_scores_the_unpaired_items(wordnet_small) -> None:
    """With the old model gone from the log, the reindex's old-space list is the bridged query
    (a mixed search), the report says so, and the verdict's paired differences are taken on
    the same rankings as the figures."""
    data, _ = _gallery(wordnet_small)
    assert data.queries is not None
    data.queries.old_vectors = None
    out = run_backbone_upgrade(
        "procrustes", data, EuclideanLift(), seed=SEED, eval_fraction=EVAL_FRACTION
    )
    report = out.report
    assert "query" not in report["metrics"]["stay"]
    assert "bridged query" in report["searched"]["query"]["reindex"]
    paired = report["paired_gains"]
    bridge = report["metrics"]["procrustes"]["query"]["recall@10"]
    reindex = report["metrics"]["reindex"]["query"]["recall@10"]
    share = paired["bridge_vs_reindex_share"]
    assert share["mean"] == pytest.approx(bridge - share["share"] * reindex, abs=1e-9)


def test_a_sampled_gallery_says_so() -> None:
    searched = describe(500, 120, 300, "old model", 200)
    assert searched["sampled"] and searched["unpaired_items"] == 300
    assert "a seeded sample of its 300" in searched["query"]["gallery"]
    assert not describe(500, 0, None, None, 200)["sampled"]
