"""The report's uncertainty calibration: hand-checkable bins, a labelled case on real vectors where
the old model's local label disagreement predicts its own failures, and the constant-norm case."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from app.ml.evaluation.calibration import (
    binned_failure_rate,
    labelled_calibration,
    unlabelled_calibration,
)
from app.ml.geometry.lorentz import exp_map0

FIXTURE = Path(__file__).resolve().parent / "fixtures/wordnet_small.npz"


def test_bins_are_equal_count_groups_in_increasing_uncertainty() -> None:
    u = np.array([0.9, 0.1, 0.5, 0.3, 0.7, 0.2])
    failed = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])
    bins = binned_failure_rate(u, failed, bins=3)
    assert [b["items"] for b in bins] == [2, 2, 2]
    assert [round(b["uncertainty"], 6) for b in bins] == [0.15, 0.4, 0.8]
    assert [b["failure_rate"] for b in bins] == [0.0, 0.5, 1.0]


def test_knn_uncertainty_predicts_old_failures_on_real_vectors() -> None:
    data = np.load(FIXTURE)
    old = torch.as_tensor(data["gloss.all-MiniLM-L6-v2"].astype(np.float32))
    points = exp_map0(old, 1.0).numpy()
    labels = np.unique(data["label"], return_inverse=True)[1]
    rows = np.random.default_rng(0).permutation(len(labels))
    eval_rows, train_rows = np.sort(rows[:300]), np.sort(rows[300:])
    out = labelled_calibration(points, labels, eval_rows, train_rows, curv=1.0)
    assert out["source"] == "knn" and not out["constant"]
    assert out["spearman"] > 0.2 > abs(out["spearman_shuffled"])
    assert sum(b["items"] for b in out["bins"]) == 300
    assert out["bins"][-1]["failure_rate"] > out["bins"][0]["failure_rate"]


def test_norm_uncertainty_on_one_radius_is_reported_constant() -> None:
    rng = np.random.default_rng(1)
    unit = rng.normal(size=(40, 8))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    points = exp_map0(torch.as_tensor(unit), 1.0).numpy()
    rows = np.arange(20)
    queries = points[rows] + 0.01 * rng.normal(size=(20, 8))
    out = unlabelled_calibration(points, rows, queries, curv=1.0)
    assert out["constant"] and out["bins"] == [] and "one radius" in out["note"]
    # Points at different radii: the norm uncertainty ranks them.
    spread = exp_map0(torch.as_tensor(unit * rng.uniform(0.2, 3.0, size=(40, 1))), 1.0).numpy()
    # The bridge finds the first ten items and answers the last ten with other items' points.
    bridged = np.concatenate([spread[:10], spread[30:40]])
    varied = unlabelled_calibration(spread, rows, bridged, curv=1.0)
    assert varied["bins"] and sum(b["failure_rate"] * b["items"] for b in varied["bins"]) == 10
    assert not varied["constant"] and len(varied["bins"]) == 10
