"""Settings only some methods read (``METHOD_ONLY_PARAMS``): refused where nothing reads them,
and kept away from the alternatives trained beside the method that does."""

from __future__ import annotations

import numpy as np
import pytest

from app.ml.auto.candidates import AutoParams
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.compat import METHOD_ONLY_PARAMS, CompatParams, settings_read_by
from app.ml.upgrade.run import UpgradeData, check_backbone_request, run_backbone_upgrade
from bench.common.wordnet import NEW_MODEL, OLD_MODEL

NON_DEFAULT = {
    "map_hidden": 16,
    "map_experts": 4,
    "map_expert_rank": 8,
    "extra_dims": 8,
    "adapter_rank": 16,
    "adapter_hidden": 32,
    "centred": True,
}


def test_every_method_only_setting_has_a_non_default_example() -> None:
    assert set(NON_DEFAULT) == set(METHOD_ONLY_PARAMS)
    defaults = CompatParams()
    assert all(v != getattr(defaults, k) for k, v in NON_DEFAULT.items())


@pytest.mark.parametrize("name", sorted(METHOD_ONLY_PARAMS))
def test_a_method_only_setting_is_refused_by_every_other_method(name: str) -> None:
    readers = METHOD_ONLY_PARAMS[name]
    value = {name: NON_DEFAULT[name]}
    for method in ("hbct", "l2", "procrustes", "affine", "mlp-adapter", "instance-map"):
        if method in readers:
            assert getattr(CompatParams.for_method(method, value), name) == NON_DEFAULT[name]
        else:
            with pytest.raises(ValueError, match=name):
                CompatParams.for_method(method, value)
            assert name in check_backbone_request(method, value, 100, 0.2, 0, True)["params"]
    # Its default value is no request for anything: every method accepts it.
    CompatParams.for_method("hbct", {name: getattr(CompatParams(), name)})


def test_the_alternatives_get_only_the_settings_they_read() -> None:
    params = CompatParams.from_dict({"epochs": 3, "adapter_rank": 16, "map_hidden": 16})
    for_procrustes = settings_read_by("procrustes", params)
    assert for_procrustes.adapter_rank == 64 and for_procrustes.map_hidden == 0
    assert for_procrustes.epochs == 3
    assert settings_read_by("affine", params).adapter_rank == 16
    assert settings_read_by("class-map", params).map_hidden == 16


def test_auto_needs_a_candidate_that_reads_a_shared_method_only_setting() -> None:
    with pytest.raises(ValueError, match="no candidate of this request"):
        AutoParams.from_dict({"adapter_rank": 16, "candidates": ["hbct", "mlp-adapter"]})
    shared = AutoParams.from_dict({"map_hidden": 16, "candidates": ["instance-map"]}).shared
    assert shared == {"map_hidden": 16}


def _data(wordnet_small: dict) -> UpgradeData:
    labels = np.unique(wordnet_small["label"], return_inverse=True)[1]
    old = wordnet_small[f"gloss.{OLD_MODEL}"]
    return UpgradeData(wordnet_small[f"gloss.{NEW_MODEL}"], old, labels)


def test_an_explicit_affine_job_trains_its_references(wordnet_small: dict) -> None:
    out = run_backbone_upgrade(
        "affine", _data(wordnet_small), EuclideanLift(), params={"epochs": 1, "adapter_rank": 16}
    )
    assert {"affine", "procrustes", "independent"} <= set(out.report["metrics"])
    assert out.params["adapter_rank"] == 16


def test_auto_routes_a_shared_map_setting_to_the_candidates_that_read_it(
    wordnet_small: dict,
) -> None:
    params = {"epochs": 1, "trials": 1, "map_hidden": 16, "candidates": ["instance-map"]}
    out = run_backbone_upgrade("auto", _data(wordnet_small), EuclideanLift(), params=params)
    names = {c["name"] for c in out.report["candidates"]}
    assert names == {"procrustes", "instance-map"}
    # The served parameters are the served method's own: an explicit request accepts them.
    assert out.params["map_hidden"] == (16 if out.method == "instance-map" else 0)
    CompatParams.for_method(out.method, {k: out.params[k] for k in METHOD_ONLY_PARAMS})


def test_a_procrustes_served_by_auto_keeps_no_other_methods_setting(wordnet_small: dict) -> None:
    params = {"epochs": 1, "trials": 1, "map_hidden": 16, "candidates": ["class-map"]}
    data = _data(wordnet_small)
    # Without labels class-map cannot train: procrustes is the only candidate, and served.
    unlabelled = UpgradeData(data.new_features, data.old_vectors, None)
    out = run_backbone_upgrade("auto", unlabelled, EuclideanLift(), params=params)
    assert out.method == "procrustes"
    assert out.params["map_hidden"] == 0
