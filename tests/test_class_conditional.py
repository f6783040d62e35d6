"""Class-conditional maps (issue 26 item 5): clustering, the Procrustes start, training through
``class-map``, serialisation, ONNX export and ``auto``'s candidate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from app.ml.auto.candidates import AutoParams
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.class_conditional import (
    fit_class_conditional_map,
    group_centroids,
    spherical_kmeans,
)
from app.ml.methods.compat import CompatParams, train_compatible_model
from app.ml.methods.heads import ClassConditionalHead
from app.ml.methods.models import model_from_bytes, model_to_bytes
from app.models.export import export_onnx
from bench.common.wordnet import NEW_MODEL, OLD_MODEL
from tests.service.test_export import cosine_target, run_onnx, unpack


def _real(wordnet_small: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lift = EuclideanLift()
    old = lift(torch.from_numpy(wordnet_small[f"gloss.{OLD_MODEL}"])).numpy()
    new = wordnet_small[f"gloss.{NEW_MODEL}"]
    labels = np.unique(wordnet_small["label"], return_inverse=True)[1]
    return new, old, labels


def test_spherical_kmeans_finds_separated_directions() -> None:
    rng = np.random.default_rng(0)
    directions = np.linalg.qr(rng.normal(size=(16, 4)))[0].T  # 4 orthonormal directions
    points = np.concatenate([d + 0.05 * rng.normal(size=(50, 16)) for d in directions])
    centroids = spherical_kmeans(torch.from_numpy(points), 4, seed=3).numpy()
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1.0, atol=1e-9)
    # Each true direction has a centroid within a small angle of it, and no two share one.
    cosine = directions @ centroids.T
    assert sorted(cosine.argmax(axis=1).tolist()) == [0, 1, 2, 3]
    assert cosine.max(axis=1).min() > 0.99
    # More centroids than rows: one per row.
    assert spherical_kmeans(torch.from_numpy(points[:3]), 8, seed=0).shape == (3, 16)


def test_group_centroids_cluster_class_means_with_labels_and_rows_without() -> None:
    rng = np.random.default_rng(1)
    features = torch.from_numpy(rng.normal(size=(60, 8)))
    labels = torch.from_numpy(np.repeat(np.arange(6), 10))
    assert group_centroids(features, labels, 16, seed=0).shape == (6, 8)  # at most one per class
    assert group_centroids(features, None, 16, seed=0).shape == (16, 8)


def test_the_map_starts_as_procrustes_and_trains_its_experts(wordnet_small: dict) -> None:
    new, old, labels = _real(wordnet_small)
    x, o, y = torch.from_numpy(new), torch.from_numpy(old), torch.from_numpy(labels)
    start = fit_class_conditional_map(x, o, y, 1.0, experts=8, rank=4, seed=0)
    procrustes = train_compatible_model("procrustes", new, old, None, 1.0)
    np.testing.assert_allclose(start.embed(new[:50]), procrustes.embed(new[:50]), atol=1e-5)
    gate = start.gate(x[:50])
    np.testing.assert_allclose(gate.sum(dim=1).detach().numpy(), 1.0, atol=1e-5)
    params = {"epochs": 2, "class_weight": 1.0, "map_experts": 8, "map_expert_rank": 4}
    model = train_compatible_model("class-map", new, old, labels, 1.0, params)
    assert isinstance(model, ClassConditionalHead) and model.experts == 8 and model.rank == 4
    assert torch.equal(model.projection, procrustes.projection)
    assert model.experts_out.abs().sum() > 0  # trained away from the zero start
    assert not np.allclose(model.embed(new[:20]), procrustes.embed(new[:20]), atol=1e-4)
    restored = model_from_bytes(model_to_bytes(model))
    np.testing.assert_allclose(restored.embed(new[:20]), model.embed(new[:20]), rtol=1e-6)
    # The label-free map (instance-map) clusters the features themselves.
    free = train_compatible_model("instance-map", new, old, None, 1.0, {**params, "epochs": 1})
    assert isinstance(free, ClassConditionalHead)


def test_settings_of_the_map_are_checked() -> None:
    with pytest.raises(ValueError, match="map_experts"):
        CompatParams.from_dict({"map_experts": -1})
    with pytest.raises(ValueError, match="map_experts"):
        CompatParams.from_dict({"map_experts": 2000})
    with pytest.raises(ValueError, match="map_expert_rank"):
        CompatParams.from_dict({"map_experts": 4, "map_expert_rank": 0})
    with pytest.raises(ValueError, match="set one"):
        CompatParams.from_dict({"map_experts": 4, "map_hidden": 16})


def test_auto_tries_class_map_through_the_class_conditional_map() -> None:
    auto = AutoParams.from_dict({"epochs": 2})
    trials = auto.settings("class-conditional-map", labelled=True)
    assert [t["map_experts"] for t in trials] == [16, 16, 16]
    assert [t["class_weight"] for t in trials] == [0.3, 1.0, 3.0]
    assert "class-conditional-map" not in auto.applicable(labelled=False)
    with pytest.raises(ValueError, match="class-conditional-map"):
        AutoParams.from_dict({"map_experts": 4})


def test_the_exported_graph_agrees_with_the_head(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ClassConditionalHead(12, 6, experts=3, rank=2).eval()
    with torch.no_grad():  # a head away from its zero start, so that the experts count
        model.experts_out.normal_()
        model.projection.normal_()
    target = cosine_target("class-map")
    unpack(export_onnx(model, target), tmp_path)
    features = np.random.default_rng(0).normal(size=(5, 12)).astype(np.float32)
    outputs = run_onnx(tmp_path / "model.onnx", features)
    # Relative as well: the head's points reach a few hundred, where two float32 engines summing
    # in different orders differ by ~1e-6 of the value (seen: 1e-3 at 401, 8 elements of 30).
    np.testing.assert_allclose(outputs["point"], model.embed(features), rtol=1e-5, atol=1e-5)
