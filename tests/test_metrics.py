"""Compatibility metrics: hand-checked cases and the real fixture (the data README's full-size
figures are checked by `python -m bench.data.reference_figures`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.ml.evaluation.metrics import (
    neighbour_recall,
    p_com,
    p_up,
    ranked_neighbours,
    retrieval_metrics,
    top1_failures,
    uncertainty_calibration,
)
from app.ml.geometry.space import EuclideanLift
from bench.common.wordnet import OLD_MODEL


def _line(positions: list[float]) -> np.ndarray:
    """Points on one geodesic through the origin: distance is |a − b| along it."""
    return np.array([[p, 0.0] for p in positions])


def test_ranking_excludes_self_and_orders_by_distance() -> None:
    x = _line([0.0, 1.0, 3.0, 3.5])
    order = ranked_neighbours(x, x, curv=1.0)
    assert order.tolist() == [[1, 2, 3], [0, 2, 3], [3, 1, 0], [2, 1, 0]]
    assert ranked_neighbours(x, x, 1.0, k=1).ravel().tolist() == [1, 0, 3, 2]


def test_cmc_and_average_precision_by_hand() -> None:
    x = _line([0.0, 1.0, 3.0, 3.5])
    labels = np.array([0, 1, 0, 1])
    m = retrieval_metrics(x, x, labels, curv=1.0, full_map=True)
    # Nearest others: 0→1 (miss), 1→0 (miss), 2→3 (miss), 3→2 (miss).
    assert m.cmc1 == 0.0
    # Rankings: 0:[1,2,3] relevant at rank 2 → AP 1/2; 1:[0,2,3] rank 3 → 1/3;
    # 2:[3,1,0] rank 3 → 1/3; 3:[2,1,0] rank 2 → 1/2.
    assert m.map_full == pytest.approx((0.5 + 1 / 3 + 1 / 3 + 0.5) / 4)
    assert m.map_at_k == pytest.approx(m.map_full)
    labels = np.array([0, 0, 1, 1])
    assert retrieval_metrics(x, x, labels, 1.0).cmc1 == 1.0


def test_p_com_and_p_up() -> None:
    assert p_com(0.7, 0.6, 0.8) == pytest.approx(0.5)
    assert p_com(0.5, 0.6, 0.8) < 0
    assert p_up(0.76, 0.8) == pytest.approx(-0.05)


def test_neighbour_recall_and_failures(wordnet_small: dict) -> None:
    old = EuclideanLift()(torch.from_numpy(wordnet_small[f"gloss.{OLD_MODEL}"])).numpy()
    assert neighbour_recall(old, old, 1.0, k=10) == 1.0
    shuffled = old[np.random.default_rng(0).permutation(len(old))]
    assert neighbour_recall(shuffled, old, 1.0, k=10) < 0.1
    failures = top1_failures(old, wordnet_small["label"], 1.0)
    cmc = retrieval_metrics(old, old, wordnet_small["label"], 1.0).cmc1
    assert failures.mean() == pytest.approx(1 - cmc)


def test_calibration_detects_signal_and_its_control_does_not() -> None:
    rng = np.random.default_rng(1)
    failures = (rng.random(2000) < 0.4).astype(float)
    informative = failures + rng.normal(0, 0.5, 2000)
    out = uncertainty_calibration(informative, failures)
    assert out["spearman"] > 0.5
    assert abs(out["spearman_shuffled"]) < 0.1
    constant = uncertainty_calibration(np.ones(2000), failures)
    assert constant["spearman"] is None and constant["constant"] is True
