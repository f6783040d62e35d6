"""BT²-style extra dimensions for class-map (issue 26 item 5): the prototype term sees them, the
old-space terms and the served model never do; settings are refused where nothing reads them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.ml.auto.candidates import AUTO_CANDIDATES, KNOWN_CANDIDATES, AutoParams
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.compat import CompatParams, train_compatible_model
from app.ml.methods.heads import LorentzHead
from app.ml.methods.models import model_from_bytes, model_to_bytes
from app.ml.upgrade.run import UpgradeData, check_backbone_request, run_backbone_upgrade
from app.upgrades.catalogue import catalogue
from bench.common.wordnet import NEW_MODEL, OLD_MODEL


def _real(wordnet_small: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    old = EuclideanLift()(torch.from_numpy(wordnet_small[f"gloss.{OLD_MODEL}"])).numpy()
    labels = np.unique(wordnet_small["label"], return_inverse=True)[1]
    return wordnet_small[f"gloss.{NEW_MODEL}"], old, labels


def test_extra_dimensions_train_the_map_but_are_not_served(wordnet_small: dict) -> None:
    new, old, labels = _real(wordnet_small)
    params = {"epochs": 3, "class_weight": 1.0}
    plain = train_compatible_model("class-map", new, old, labels, 1.0, params, seed=4)
    bt2 = train_compatible_model(
        "class-map", new, old, labels, 1.0, {**params, "extra_dims": 32}, seed=4
    )
    again = train_compatible_model(
        "class-map", new, old, labels, 1.0, {**params, "extra_dims": 32}, seed=4
    )
    # The served model is the map alone: the same kind and width as class-map's.
    assert isinstance(bt2, LorentzHead) and bt2.output_dim == plain.output_dim == old.shape[1]
    assert bt2.embed(new[:5]).shape == old[:5].shape
    # The extra dimensions changed what the map learned, and deterministically so.
    assert not np.allclose(bt2.embed(new[:50]), plain.embed(new[:50]), atol=1e-4)
    np.testing.assert_array_equal(bt2.embed(new[:50]), again.embed(new[:50]))
    restored = model_from_bytes(model_to_bytes(bt2))
    np.testing.assert_allclose(restored.embed(new[:20]), bt2.embed(new[:20]), rtol=1e-6)


def test_extra_dimensions_act_only_through_the_class_term(wordnet_small: dict) -> None:
    """With the class terms weighted 0 the branch gets no say in the map: the same map as
    without it. (So the difference above comes from the prototype term, not from the seed.)"""
    new, old, labels = _real(wordnet_small)
    params = {"epochs": 2, "class_weight": 0.0}
    plain = train_compatible_model("class-map", new, old, labels, 1.0, params, seed=1)
    bt2 = train_compatible_model(
        "class-map", new, old, labels, 1.0, {**params, "extra_dims": 16}, seed=1
    )
    np.testing.assert_allclose(bt2.embed(new[:50]), plain.embed(new[:50]), atol=1e-6)


def test_extra_dims_is_refused_where_nothing_reads_it(wordnet_small: dict) -> None:
    new, old, labels = _real(wordnet_small)
    with pytest.raises(ValueError, match="extra_dims"):
        CompatParams.from_dict({"extra_dims": -1})
    with pytest.raises(ValueError, match="extra_dims"):
        CompatParams.from_dict({"extra_dims": 5000})
    with pytest.raises(ValueError, match="class-map"):
        CompatParams.for_method("hbct", {"extra_dims": 8})
    assert CompatParams.for_method("class-map", {"extra_dims": 8}).extra_dims == 8
    with pytest.raises(ValueError, match="class-map"):
        train_compatible_model("instance-map", new, old, labels, 1.0, {"extra_dims": 8})
    # Before any training, as the API's 4xx: an explicit method that ignores it, and auto's
    # shared overrides (which reach every candidate).
    problems = check_backbone_request("hbct", {"extra_dims": 8}, 100, 0.2, 0, True)
    assert "extra_dims" in problems["params"]
    problems = check_backbone_request("auto", {"extra_dims": 8}, 100, 0.2, 0, True)
    assert "class-map-bt2" in problems["params"]
    # With the candidate named, the setting is the candidate's own: refused as such.
    with pytest.raises(ValueError, match="fixed by auto for candidate 'class-map-bt2'"):
        AutoParams.from_dict({"extra_dims": 8, "candidates": ["class-map-bt2"]})
    assert check_backbone_request("class-map", {"extra_dims": 8}, 100, 0.2, 0, True) == {}


def test_auto_trains_class_map_bt2_only_when_named() -> None:
    assert "class-map-bt2" in KNOWN_CANDIDATES and "class-map-bt2" not in AUTO_CANDIDATES
    assert "class-map-bt2" not in AutoParams.from_dict({}).candidates
    auto = AutoParams.from_dict({"epochs": 2, "candidates": ["class-map", "class-map-bt2"]})
    assert auto.candidates == ("procrustes", "class-map", "class-map-bt2")
    trials = auto.settings("class-map-bt2", labelled=True)
    assert [t["extra_dims"] for t in trials] == [128, 128, 128]
    assert [t["class_weight"] for t in trials] == [0.3, 1.0, 3.0]
    extra = auto.next_settings("class-map-bt2", True, trials, [0.1, 0.2, 0.3], 2)
    assert extra is not None and extra["extra_dims"] == 128 and extra["class_weight"] > 3.0
    assert "extra_dims" not in auto.settings("class-map", labelled=True)[0]
    assert "class-map-bt2" not in auto.applicable(labelled=False)


def test_the_catalogue_lists_extra_dims_for_class_map_only() -> None:
    listed = {m["name"]: {p["name"]: p for p in m["params"]} for m in catalogue()["methods"]}
    spec = listed["class-map"]["extra_dims"]
    assert spec["default"] == 0 and spec["minimum"] == 0 and spec["maximum"] == 4096
    assert [name for name, params in listed.items() if "extra_dims" in params] == ["class-map"]


def test_an_explicit_class_map_job_with_extra_dims_trains_its_references(
    wordnet_small: dict,
) -> None:
    # procrustes and the independent head are trained beside the requested method with its
    # request; a setting only class-map reads must not reach them (it made them refuse).
    new, _, labels = _real(wordnet_small)
    data = UpgradeData(new, wordnet_small[f"gloss.{OLD_MODEL}"], labels)
    out = run_backbone_upgrade(
        "class-map", data, EuclideanLift(), params={"epochs": 2, "extra_dims": 8}
    )
    assert {"class-map", "procrustes", "independent"} <= set(out.report["metrics"])
    assert out.params["extra_dims"] == 8
