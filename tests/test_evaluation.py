"""Instance, query→document and class views: hand-checked cases and the real fixture."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from app.ml.evaluation.metrics import retrieval_metrics
from app.ml.evaluation.retrieval import (
    arr,
    class_metrics,
    compatibility,
    instance_metrics,
    json_safe,
    query_metrics,
    top_k,
)
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.heads import orthogonal_procrustes
from bench.common.wordnet import NEW_MODEL, OLD_MODEL


def _line(positions: list[float]) -> np.ndarray:
    """Points on one geodesic through the origin: distance is |a − b| along it."""
    return np.array([[p, 0.0] for p in positions])


def test_top_k_orders_by_lorentz_distance_and_excludes_self() -> None:
    x = _line([0.0, 1.0, 3.0, 3.5])
    assert top_k(x, x, 3, exclude_self=True).tolist() == [
        [1, 2, 3],
        [0, 2, 3],
        [3, 1, 0],
        [2, 1, 0],
    ]
    q = _line([2.9])
    assert top_k(q, x, 2).tolist() == [[2, 3]]


def test_top_k_cosine_ignores_norms_and_breaks_ties_by_index() -> None:
    gallery = np.array([[1.0, 0.0], [0.0, 5.0], [2.0, 0.0], [1.0, 1.0]])
    # Rows 0 and 2 point the same way: equal cosine, lower index first.
    assert top_k(np.array([[3.0, 0.1]]), gallery, 4, space="cosine").tolist() == [[0, 2, 3, 1]]


def test_top_k_is_the_same_in_any_chunk_size(wordnet_small: dict) -> None:
    pts = EuclideanLift()(torch.from_numpy(wordnet_small[f"gloss.{OLD_MODEL}"])).numpy()
    a = top_k(pts[:100], pts, 20, chunk=7)
    b = top_k(pts[:100], pts, 20, chunk=512)
    np.testing.assert_array_equal(a, b)


def test_instance_metrics_by_hand() -> None:
    ranked = np.array([[0, 1, 2], [0, 1, 2], [0, 1, 2]])
    m = instance_metrics(ranked, np.array([0, 1, 7]))
    assert m["recall@1"] == pytest.approx(1 / 3)
    assert m["recall@10"] == pytest.approx(2 / 3)
    assert m["mrr@100"] == pytest.approx((1 + 0.5 + 0) / 3)


def test_query_metrics_by_hand() -> None:
    ranked = np.array([[5, 1, 2, 3], [4, 3, 2, 1], [9, 9, 9, 9]])
    relevant = [np.array([1, 3]), np.array([4]), np.array([], dtype=np.int64)]
    m = query_metrics(ranked, relevant)
    # Query 0: hits at ranks 2 and 4 of 2 relevant; query 1: hit at rank 1; query 2 skipped.
    assert m["recall@1"] == pytest.approx((0 + 1) / 2)
    assert m["recall@10"] == pytest.approx((1 + 1) / 2)
    assert m["mrr@100"] == pytest.approx((0.5 + 1) / 2)
    dcg0 = 1 / math.log2(3) + 1 / math.log2(5)
    idcg0 = 1 + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx((dcg0 / idcg0 + 1) / 2)
    assert math.isnan(query_metrics(ranked[2:], relevant[2:])["recall@1"])


def test_class_metrics_by_hand_with_both_normalisations() -> None:
    x = _line([0.0, 1.0, 3.0, 3.5, 10.0])
    labels = np.array([0, 1, 0, 1, 0])
    m = class_metrics(x, x, labels)
    found = class_metrics(x, x, labels, map_normalisation="found")
    # Rankings (self excluded): 0:[1,2,3,4] 1:[0,2,3,4] 2:[3,1,0,4] 3:[2,1,0,4] 4:[3,2,1,0].
    assert m["cmc1"] == 0.0
    # Item 0 (label 0, relevant 2 and 4): hits at ranks 2, 4 → (1/2 + 2/4) / 2.
    ap = [(1 / 2 + 2 / 4) / 2, (1 / 3) / 1, (1 / 3 + 2 / 4) / 2, (1 / 3) / 1, (1 / 2 + 2 / 4) / 2]
    assert m["map@100"] == pytest.approx(np.mean(ap))
    assert found["map@100"] == pytest.approx(np.mean(ap))  # every relevant item found here
    short = class_metrics(x, x, labels, depth=2)
    # At depth 2 item 1 finds nothing; item 0 finds one of its two relevant items at rank 2.
    assert short["map@100"] == pytest.approx(np.mean([0.5 / 2, 0, 0, 0, 0.5 / 2]))
    assert class_metrics(x, x, labels, depth=2, map_normalisation="found")[
        "map@100"
    ] == pytest.approx(np.mean([0.5, 0, 0, 0, 0.5]))


def test_found_normalisation_matches_the_older_metric(wordnet_small: dict) -> None:
    pts = EuclideanLift()(torch.from_numpy(wordnet_small[f"gloss.{OLD_MODEL}"])).numpy()
    labels = wordnet_small["label"]
    old = retrieval_metrics(pts, pts, labels, 1.0)
    new = class_metrics(pts, pts, labels, map_normalisation="found")
    assert new["cmc1"] == pytest.approx(old.cmc1)
    assert new["map@100"] == pytest.approx(old.map_at_k)
    # Dividing by every relevant item can only lower the figure.
    assert class_metrics(pts, pts, labels)["map@100"] < new["map@100"]


def test_instance_view_on_the_fixture(wordnet_small: dict) -> None:
    """Procrustes puts most items' own old gloss first; a shuffled map puts almost none."""
    old = wordnet_small[f"gloss.{OLD_MODEL}"]
    new = wordnet_small[f"gloss.{NEW_MODEL}"]
    lift = EuclideanLift()
    gallery = lift(torch.from_numpy(old)).numpy()
    perm = np.random.default_rng(0).permutation(len(old))
    train, held = perm[:600], np.sort(perm[600:])
    w, _ = orthogonal_procrustes(torch.from_numpy(new[train]), torch.from_numpy(old[train]))
    mapped = lift(torch.from_numpy(new[held]) @ w).numpy()
    m = instance_metrics(top_k(mapped, gallery, 100), held)
    assert m["recall@1"] > 0.8 and m["recall@10"] > 0.95
    shuffled = instance_metrics(top_k(mapped[::-1], gallery, 100), held)
    assert shuffled["recall@1"] < 0.05
    native = instance_metrics(top_k(new[held], new, 100, space="cosine"), held)
    assert native["recall@1"] == 1.0


def test_arr_compatibility_and_json() -> None:
    assert arr({"a": 0.4, "b": 0.1}, {"a": 0.5, "b": 0.0}) == {
        "a": 0.8,
        "b": pytest.approx(math.nan, nan_ok=True),
    }
    out = compatibility(
        {"cmc1": 0.65},
        {"cmc1": 0.70},
        {"cmc1": 0.60},
        {"raw_new": {"cmc1": 0.70}, "independent": {"cmc1": 0.80}},
    )
    assert out["reference"]["cmc1"] == "independent"
    assert out["p_com"]["cmc1"] == pytest.approx(0.25)
    assert out["p_up"]["cmc1"] == pytest.approx(-0.125)
    # No reference above the old model: there is no gap to close, and a negative denominator
    # would invert the share (a collapsed map at 0.05 would read +55). P_com is undefined.
    below = compatibility(
        {"cmc1": 0.05}, {"cmc1": 0.59}, {"cmc1": 0.60}, {"independent": {"cmc1": 0.59}}
    )
    assert math.isnan(below["p_com"]["cmc1"])
    assert below["p_up"]["cmc1"] == pytest.approx(0.0)
    safe = json_safe({"x": math.nan, "y": [np.float32(1.5), np.int64(2), math.inf], "z": True})
    assert safe == {"x": None, "y": [1.5, 2, None], "z": True}
    json.dumps(safe, allow_nan=False)
