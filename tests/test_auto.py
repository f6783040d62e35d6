"""``auto``: parameters, objectives, query splits, selection, recommendation and progress."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch

from app.ml.auto.candidates import AUTO_CANDIDATES, INSTANCE_FLOOR, METHOD_OF, AutoParams
from app.ml.auto.verdict import REINDEX_BELOW_ARR, recommend
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.compat import train_compatible_model
from app.ml.methods.heads import AdapterHead
from app.ml.methods.models import model_from_bytes, model_to_bytes
from app.ml.methods.training import NO_HOOKS, TrainingHooks
from app.ml.upgrade.pipeline import UpgradeContext
from app.ml.upgrade.run import (
    BACKBONE_METHODS,
    OBJECTIVES,
    QueryLog,
    UpgradeData,
    check_backbone_request,
    default_objective,
    run_backbone_upgrade,
    split_queries,
)
from bench.common.wordnet import NEW_MODEL, OLD_MODEL

TEST_PARAMS = {"epochs": 3}


def _fixture_data(wordnet_small: dict, *, labels: bool, log: bool) -> UpgradeData:
    n = len(wordnet_small["label"])
    queries = None
    if log:
        queries = QueryLog(
            features=wordnet_small[f"lemma.{NEW_MODEL}"],
            old_vectors=wordnet_small[f"lemma.{OLD_MODEL}"],
            relevant=[np.array([i]) for i in range(n)],
        )
    codes = np.unique(wordnet_small["label"], return_inverse=True)[1] if labels else None
    return UpgradeData(
        wordnet_small[f"gloss.{NEW_MODEL}"], wordnet_small[f"gloss.{OLD_MODEL}"], codes, queries
    )


def test_interface_names() -> None:
    assert "auto" in BACKBONE_METHODS
    assert OBJECTIVES == ("query", "class", "instance")
    assert default_objective(labelled=True, has_relevance=True) == "query"
    assert default_objective(labelled=True, has_relevance=False) == "class"
    assert default_objective(labelled=False, has_relevance=False) == "instance"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"candidates": ["magic"]}, "unknown candidate"),
        ({"candidates": "hbct"}, "list of candidate names"),
        ({"trials": 0}, "trials"),
        ({"trials": True}, "trials"),
        ({"old_proto_weight": 3.0}, "tuned by auto for candidate 'hbct'"),
        ({"epochs": 0}, "epochs"),
        ({"no_such": 1}, "unknown parameter"),
    ],
)
def test_auto_params_are_validated(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AutoParams.from_dict(params)
    problems = check_backbone_request("auto", params, 100, 0.2, 0, True)
    assert message.split("'")[0] in problems["params"]


def test_auto_params_accept_shared_overrides_and_subsets() -> None:
    p = AutoParams.from_dict({"epochs": 2, "candidates": ["affine"], "trials": 1})
    assert p.candidates == ("procrustes", "affine") and p.trials == 1
    assert p.settings("affine", labelled=True) == [{"epochs": 2, "adapter_rank": 64}]
    # Tuning an axis the chosen candidates do not tune is a shared override.
    assert AutoParams.from_dict({"candidates": ["affine"], "old_proto_weight": 1.0}).shared
    full = AutoParams.from_dict(None)
    assert full.candidates == AUTO_CANDIDATES
    assert {len(full.settings(n, True)) for n in AUTO_CANDIDATES if n != "procrustes"} == {3}
    assert full.settings("hbct", labelled=True)[0]["old_proto_weight"] == 0.0
    assert "compat_weight" in full.settings("hbct", labelled=False)[0]


def test_objective_is_checked_against_the_data() -> None:
    ok = check_backbone_request("auto", None, 100, 0.2, 0, True, objective="class")
    assert ok == {}
    no_rel = check_backbone_request("auto", None, 100, 0.2, 0, True, objective="query", n_queries=5)
    assert "relevant" in no_rel["objective"]
    no_labels = check_backbone_request("hbct", None, 100, 0.2, 0, False, objective="class")
    assert "labels" in no_labels["objective"]
    unknown = check_backbone_request("auto", None, 100, 0.2, 0, False, objective="speed")
    assert "unknown objective" in unknown["objective"]
    fine = check_backbone_request(
        "auto", None, 100, 0.2, 0, False, objective="query", queries_with_relevance=3
    )
    assert fine == {}


def test_run_refuses_an_objective_the_data_cannot_measure(wordnet_small: dict) -> None:
    data = _fixture_data(wordnet_small, labels=False, log=False)
    with pytest.raises(ValueError, match="needs labels"):
        run_backbone_upgrade("auto", data, EuclideanLift(), objective="class")


def test_query_split_follows_the_first_relevant_item() -> None:
    eval_idx = np.array([2, 5])
    queries = QueryLog(
        features=np.zeros((6, 3)),
        relevant=[np.array([2, 0]), np.array([0, 2]), np.array([5]), np.array([1]), [], []],
    )
    train, held = split_queries(queries, eval_idx, 0.5, seed=0)
    assert set(held[held < 4]) == {0, 2}  # first relevant row held out
    assert set(train[train < 4]) == {1, 3}
    # Of the two without relevance, floor(2 × 0.5) = 1 is held out.
    assert len(set(held) & {4, 5}) == 1
    assert sorted([*train, *held]) == list(range(6))


def test_instance_map_learns_from_query_pairs(wordnet_small: dict) -> None:
    lift = EuclideanLift()
    old = lift(torch.from_numpy(wordnet_small[f"gloss.{OLD_MODEL}"])).numpy()
    new = wordnet_small[f"gloss.{NEW_MODEL}"]
    q_new = wordnet_small[f"lemma.{NEW_MODEL}"]
    q_old = lift(torch.from_numpy(wordnet_small[f"lemma.{OLD_MODEL}"])).numpy()
    one = {"epochs": 1}
    plain = train_compatible_model("instance-map", new, old, None, 1.0, one)
    logged = train_compatible_model(
        "instance-map", new, old, None, 1.0, one, extra_pairs=(q_new, q_old)
    )
    x = q_new[:20]
    assert not np.allclose(plain.embed(x), logged.embed(x))
    with pytest.raises(ValueError, match="extra_pairs"):
        train_compatible_model(
            "instance-map", new, old, None, 1.0, one, extra_pairs=(q_new[:, :5], q_old)
        )


def test_class_map_needs_labels_and_moves_queries_toward_their_class(wordnet_small: dict) -> None:
    lift = EuclideanLift()
    old = lift(torch.from_numpy(wordnet_small[f"gloss.{OLD_MODEL}"])).numpy()
    new = wordnet_small[f"gloss.{NEW_MODEL}"]
    labels = np.unique(wordnet_small["label"], return_inverse=True)[1]
    with pytest.raises(ValueError, match="needs labels"):
        train_compatible_model("class-map", new, old, None, 1.0, {"epochs": 1})
    params = {"epochs": 3}
    instance = train_compatible_model("instance-map", new, old, labels, 1.0, params)
    classed = train_compatible_model(
        "class-map", new, old, labels, 1.0, {**params, "class_weight": 1.0}
    )

    def class_margin(model) -> float:
        """Mean cosine to the item's own class mean in the old space minus to other classes'."""
        # Spatial parts: at the origin they point where the tangent vectors do.
        t = model.embed(new)[:, 1:]
        t /= np.linalg.norm(t, axis=1, keepdims=True)
        means = np.stack([old[labels == k, 1:].mean(0) for k in range(labels.max() + 1)])
        means /= np.linalg.norm(means, axis=1, keepdims=True)
        cos = t @ means.T
        own = cos[np.arange(len(labels)), labels]
        return float((own - (cos.sum(1) - own) / (cos.shape[1] - 1)).mean())

    # The class terms are what differ: the same start and instance term, a larger class margin.
    assert class_margin(classed) > class_margin(instance) + 0.01


def test_auto_skips_label_only_candidates_without_labels() -> None:
    auto = AutoParams.from_dict({})
    assert "class-map" in auto.applicable(labelled=True)
    assert "class-map" not in auto.applicable(labelled=False)
    assert auto.skipped(labelled=False) == ["class-map", "class-map-mlp", "class-conditional-map"]


def test_class_map_mlp_is_class_map_through_a_non_linear_map(wordnet_small: dict) -> None:
    # The candidate's fixed setting is in every trial, the extra one included, and no shared
    # override can change it while the candidate is in.
    auto = AutoParams.from_dict({"epochs": 2})
    trials = auto.settings("class-map-mlp", labelled=True)
    assert [t["map_hidden"] for t in trials] == [256, 256, 256]
    assert [t["class_weight"] for t in trials] == [0.3, 1.0, 3.0]
    extra = auto.next_settings("class-map-mlp", True, trials, [0.1, 0.2, 0.3], 2)
    assert extra is not None and extra["map_hidden"] == 256 and extra["class_weight"] > 3.0
    assert "map_hidden" not in auto.settings("class-map", labelled=True)[0]
    with pytest.raises(ValueError, match="class-map-mlp"):
        AutoParams.from_dict({"map_hidden": 64})
    assert AutoParams.from_dict({"map_hidden": 64, "candidates": ["class-map"]}).shared == {
        "map_hidden": 64
    }
    # The map itself: the fixed Procrustes projection plus a residual MLP, started at Procrustes.
    lift = EuclideanLift()
    old = lift(torch.from_numpy(wordnet_small[f"gloss.{OLD_MODEL}"])).numpy()
    new = wordnet_small[f"gloss.{NEW_MODEL}"]
    labels = np.unique(wordnet_small["label"], return_inverse=True)[1]
    params = {"epochs": 2, "class_weight": 1.0}
    linear = train_compatible_model("class-map", new, old, labels, 1.0, params)
    mlp = train_compatible_model("class-map", new, old, labels, 1.0, {**params, "map_hidden": 16})
    procrustes = train_compatible_model("procrustes", new, old, None, 1.0)
    assert isinstance(mlp, AdapterHead) and mlp.residual_hidden == 16
    assert torch.equal(mlp.projection, procrustes.projection)
    last = mlp.residual[-1]
    assert last.weight.abs().sum() > 0  # trained away from the zero start
    assert not np.allclose(mlp.embed(new[:20]), linear.embed(new[:20]), atol=1e-4)
    restored = model_from_bytes(model_to_bytes(mlp))
    np.testing.assert_allclose(restored.embed(new[:20]), mlp.embed(new[:20]), rtol=1e-6)
    with pytest.raises(ValueError, match="map_hidden"):
        train_compatible_model("class-map", new, old, labels, 1.0, {"map_hidden": -1})


@pytest.mark.slow
def test_auto_on_the_fixture_with_a_query_log(wordnet_small: dict) -> None:
    data = _fixture_data(wordnet_small, labels=True, log=True)
    events: list[dict] = []
    # No wall-clock bound here: speed is a benchmark's (BENCHMARKS.md), and a timed assertion
    # fails on a loaded 2-core machine without saying anything about the code.
    out = run_backbone_upgrade(
        "auto", data, EuclideanLift(), params=TEST_PARAMS, hooks=TrainingHooks(events.append)
    )
    report = out.report
    json.dumps(report, allow_nan=False)
    assert report["objective"] == "query" and report["requested_method"] == "auto"
    assert report["chosen_candidate"] == report["chosen_method"]
    assert out.method == report["method"] == METHOD_OF[report["chosen_method"]]
    assert set(report["views"]) == {"instance", "query", "class"}
    names = [c["name"] for c in report["candidates"]]
    assert names == list(AUTO_CANDIDATES)
    by_name = {c["name"]: c for c in report["candidates"]}
    # The grid's 3 and two extra trials each (past an edge, or between the best and a neighbour).
    assert {len(c["trials"]) for n, c in by_name.items() if n != "procrustes"} == {5}
    chosen = by_name[report["chosen_candidate"]]
    # Never worse than procrustes on validation, and instances kept.
    assert (
        chosen["validation"]["query"]["recall@10"]
        >= by_name["procrustes"]["validation"]["query"]["recall@10"]
    )
    floor = INSTANCE_FLOOR * by_name["procrustes"]["validation"]["instance"]["recall@1"]
    assert chosen["eligible"] and chosen["validation"]["instance"]["recall@1"] >= floor
    for name in ("stay", "reindex", "procrustes", *names):
        assert "query" in report["metrics"][name] and "instance" in report["metrics"][name]
    assert report["metrics"][report["chosen_candidate"]]["arr"]["query"]["recall@10"] is not None
    assert report["metrics"][report["chosen_candidate"]]["p_com"]["cmc1"] is not None
    assert set(report["metric_meanings"]) >= {"instance", "query", "class", "arr"}
    rec = report["recommendation"]
    # Old query vectors are logged: the options are measured, so the verdict is not "measure".
    assert (
        rec["action"] in ("bridge", "stay", "transition")
        and rec["method"] == report["chosen_candidate"]
    )
    assert "recall@10" in rec["why"]
    assert report["auto"]["n_fit"] + report["auto"]["n_validation"] == report["n_train"]
    assert report["auto"]["n_validation_queries"] > 0
    assert report["n_eval_queries_with_relevance"] == report["n_eval"]
    # Progress: phases, candidates and a finite ETA after the first epoch.
    assert {e["phase"] for e in events} == {"training", "evaluating"}
    assert {e["candidate"] for e in events} >= set(names)
    assert events[-1]["candidate_index"] == events[-1]["candidates"]
    assert all(e["eta_s"] is None or e["eta_s"] >= 0 for e in events)
    assert any(e["eta_s"] for e in events)
    if out.method != "procrustes":
        assert len(report["history"]) == TEST_PARAMS["epochs"]


def test_auto_without_labels_or_queries_selects_by_own_item_recall(wordnet_small: dict) -> None:
    data = _fixture_data(wordnet_small, labels=False, log=False)
    out = run_backbone_upgrade(
        "auto",
        data,
        EuclideanLift(),
        params={**TEST_PARAMS, "candidates": ["affine", "instance-map"], "trials": 1},
    )
    report = out.report
    assert report["objective"] == "instance" and report["views"] == ["instance"]
    assert report["auto"]["selection_metric"] == {"view": "instance", "metric": "recall@1"}
    assert [c["name"] for c in report["candidates"]] == ["procrustes", "affine", "instance-map"]
    best = max(c["validation"]["instance"]["recall@1"] for c in report["candidates"])
    assert next(c for c in report["candidates"] if c["name"] == out.method)["validation"][
        "instance"
    ]["recall@1"] == pytest.approx(best)
    # Neither queries nor labels: nothing measures the user's task, whatever own-item recall says.
    assert report["recommendation"]["action"] == "measure"
    assert report["recommendation"]["missing"]


def test_auto_with_too_few_items_serves_procrustes() -> None:
    rng = np.random.default_rng(0)
    old = rng.normal(size=(30, 4)).astype(np.float32)
    new = np.concatenate([old, rng.normal(size=(30, 2))], axis=1).astype(np.float32)
    out = run_backbone_upgrade("auto", UpgradeData(new, old), EuclideanLift(), eval_fraction=0.4)
    assert out.method == "procrustes"
    assert "too few" in out.report["auto"]["note"]


def _metrics(bridge: float, stay: float | None, reindex: float, view: str = "query") -> dict:
    metric = {"query": "recall@10", "instance": "recall@1", "class": "cmc1"}[view]
    m = {
        "served": {view: {metric: bridge}, "arr": {view: {metric: bridge / reindex}}},
        "reindex": {view: {metric: reindex}},
        "stay": {} if stay is None else {view: {metric: stay}},
    }
    return m


def test_recommendation_rule() -> None:
    """The rule's branches on bare figures: without the report's paired per-query differences
    every standard error is taken as 0 and the verdict says so (``evidence`` "point"); the
    paired rule itself (issue 42 item 5) is tested in tests/test_verdict_paired.py."""
    # The new model beats the old one and no bridge does: re-embed while the old model serves.
    transition = recommend(_metrics(0.44, 0.49, 0.57), "served", "query")
    assert transition["evidence"] == "point" and "point figures" in transition["why"]
    assert transition["action"] == "transition" and transition["endpoints"] == {
        "at_0": 0.49,
        "at_100": 0.57,
    }
    assert "0.440" in transition["why"] and "0.490" in transition["why"]
    assert "old_vectors" in transition["next_step"]
    # Neither beats it: stay.
    stay = recommend(_metrics(0.44, 0.49, 0.48), "served", "query")
    assert stay["action"] == "stay"
    # The bridge beats the old model but keeps too little of a reindex: transition too.
    low = 0.57 * (REINDEX_BELOW_ARR - 0.05)
    assert recommend(_metrics(low, 0.30, 0.57), "served", "query")["action"] == "transition"
    bridge = recommend(_metrics(0.52, 0.49, 0.57), "served", "query")
    assert bridge["action"] == "bridge" and bridge["method"] == "served"
    # No old query vectors: staying is not measured, so no bridge is recommended over it.
    unmeasured = recommend(_metrics(0.52, None, 0.57), "served", "query")
    assert unmeasured["action"] == "measure" and "old_vectors" in unmeasured["missing"][0]
    # Own-item recall is fidelity, never the evidence: measure, and say what to upload.
    instance = recommend(_metrics(0.9, None, 1.0, "instance"), "served", "instance")
    assert instance["action"] == "measure" and "relevant_ids" in instance["missing"][0]
    assert "stay n/a" in instance["why"] and not math.isnan(len(instance["rule"]))


def test_without_the_old_model_there_is_no_stay_and_no_transition() -> None:
    low = 0.57 * (REINDEX_BELOW_ARR - 0.05)
    for bridge, stay, expected in ((0.44, 0.49, "bridge"), (low, 0.49, "reindex")):
        verdict = recommend(
            _metrics(bridge, stay, 0.57), "served", "query", old_model_available=False
        )
        assert verdict["action"] == expected and "stay not an option" in verdict["why"]
    assert (
        recommend(_metrics(0.52, None, 0.57), "served", "query", old_model_available=False)[
            "action"
        ]
        == "bridge"
    )
    gone = recommend(
        _metrics(0.9, None, 1.0, "instance"), "served", "instance", old_model_available=False
    )
    assert gone["action"] == "measure"


def test_a_bridge_recommendation_names_the_metrics_where_staying_is_better() -> None:
    """The verdict follows the objective's metric (R@10), but a user who reads only the verdict
    must still learn that the old model finds the first hit more often."""
    metrics = _metrics(0.51, 0.49, 0.57)
    metrics["served"]["query"]["recall@1"] = 0.245
    metrics["stay"]["query"]["recall@1"] = 0.26
    verdict = recommend(metrics, "served", "query")
    assert verdict["action"] == "bridge"
    assert "below the old model on query recall@1: bridge 0.245, stay 0.260" in verdict["why"]
    # Nothing to add where the bridge is at least as good on every metric.
    metrics["served"]["query"]["recall@1"] = 0.27
    assert "below the old model" not in recommend(metrics, "served", "query")["why"]


def test_query_objective_without_validation_queries_selects_by_own_item_recall(
    wordnet_small: dict,
) -> None:
    """Queries only about held-out items (no log of training queries): nothing validates query
    search, so auto chooses by what validation measures (own-item R@1) and says why."""
    n = len(wordnet_small["label"])
    held = np.sort(np.random.default_rng(0).permutation(n)[n - n // 5 :])
    data = UpgradeData(
        wordnet_small[f"gloss.{NEW_MODEL}"],
        wordnet_small[f"gloss.{OLD_MODEL}"],
        queries=QueryLog(
            features=wordnet_small[f"lemma.{NEW_MODEL}"][held],
            relevant=[np.array([i]) for i in held],
        ),
    )
    params = {"epochs": 2, "candidates": ["affine", "instance-map"], "trials": 1}
    out = run_backbone_upgrade("auto", data, EuclideanLift(), params=params)
    report = out.report
    assert report["objective"] == "query" and report["n_train_queries"] == 0
    assert "no validation data" in report["auto"]["note"]
    assert "chosen by instance recall@1" in report["auto"]["note"]
    assert report["auto"]["selection_metric"] == {"view": "instance", "metric": "recall@1"}
    r1 = {c["name"]: c["validation"]["instance"]["recall@1"] for c in report["candidates"]}
    assert r1[out.method] == max(r1.values())
    assert out.report["recommendation"]["metric"] == {"view": "query", "metric": "recall@10"}


def test_logged_queries_train_toward_their_old_vectors_and_their_relevant_documents(
    wordnet_small: dict,
) -> None:
    """A query logged with both the old model's vector and relevance gives two training pairs:
    toward its old vector (the old query distribution) and toward each relevant item's old
    point (the search itself). Relevant items outside the training rows give no pair."""
    data = _fixture_data(wordnet_small, labels=False, log=True)
    assert data.queries is not None
    data.queries.relevant[0] = np.array([0, 150, 3])
    ctx = UpgradeContext.build(data, EuclideanLift(), 0, NO_HOOKS)
    rows = np.arange(100)
    queries = np.array([0, 1, 2, 150])
    pairs = ctx.extra_pairs(queries, rows)
    assert pairs is not None
    features, targets = pairs
    # Four old-vector pairs, then relevance pairs: query 0 → items 0 and 3, queries 1 and 2 →
    # their own items; query 150's item is not a training row.
    assert features.shape[0] == targets.shape[0] == 4 + 4
    np.testing.assert_array_equal(targets[:4], ctx.query_old_points[queries])
    np.testing.assert_array_equal(targets[4:], ctx.old_points[[0, 3, 1, 2]])
    np.testing.assert_array_equal(features[4:], data.queries.features[[0, 0, 1, 2]])
    # Relevance alone still trains.
    data.queries.old_vectors = None
    ctx = UpgradeContext.build(data, EuclideanLift(), 0, NO_HOOKS)
    features, targets = ctx.extra_pairs(queries, rows)
    np.testing.assert_array_equal(targets, ctx.old_points[[0, 3, 1, 2]])
    assert ctx.extra_pairs(np.array([150]), rows) is None


def test_extra_trials_widen_past_an_edge_or_refine_inside() -> None:
    from app.ml.auto import widening

    # The best at the high end of (0.3, 1, 3): one grid step past it.
    assert widening.next_value([0.3, 1.0, 3.0], [0, 1, 2], 2, integer=False) == 9.0
    # At the low end of integer ranks (16, 64, 256): a quarter, rounded.
    assert widening.next_value([64, 16, 256], [1, 2, 0], 1, integer=True) == 4
    # Inside: between the best and its better neighbour (geometric mean).
    assert widening.next_value([0.3, 1.0, 3.0], [0, 2, 1], 1, integer=False) == 1.73
    assert widening.next_value([0.3, 1.0, 3.0], [1, 2, 0], 1, integer=False) == 0.548
    # A weight of 0 is the axis's natural end: not an edge, so refine towards the next value.
    assert widening.next_value([0.0, 1.0, 3.0], [2, 1, 0], 0, False, bound=0.0) == 0.5
    # Nothing new between neighbouring integers, nor below rank 1.
    assert widening.next_value([1, 2], [1, 0], 0, integer=True) is None
    assert widening.edge([1.0, 1.0], 0) is None


def test_extra_trials_are_validated_and_recorded() -> None:
    params = AutoParams.from_dict({"extra_trials": 2})
    assert params.extra_trials == 2 and params.to_dict()["extra_trials"] == 2
    assert AutoParams.from_dict({}).extra_trials == 2
    for bad in (-1, 4, True, 1.5):
        with pytest.raises(ValueError, match="extra_trials"):
            AutoParams.from_dict({"extra_trials": bad})
    # None for an untuned candidate, nor with a single grid trial (no edge to speak of).
    assert params.extra_for("procrustes", labelled=True) == 0
    assert AutoParams.from_dict({"trials": 1}).extra_for("affine", labelled=True) == 0
    assert params.extra_for("affine", labelled=True) == 2


def test_an_extra_trial_follows_the_best_of_the_grid(wordnet_small: dict) -> None:
    data = _fixture_data(wordnet_small, labels=True, log=False)
    params = {**TEST_PARAMS, "candidates": ["class-map"], "trials": 2, "extra_trials": 1}
    events: list[dict] = []
    out = run_backbone_upgrade(
        "auto", data, EuclideanLift(), params=params, hooks=TrainingHooks(events.append)
    )
    (classed,) = [c for c in out.report["candidates"] if c["name"] == "class-map"]
    weights = [t["settings"]["class_weight"] for t in classed["trials"]]
    assert weights[:2] == [0.3, 1.0] and len(weights) == 3
    grid = classed["trials"][:2]
    grid_best = max(
        range(2), key=lambda i: (grid[i]["eligible"], grid[i]["validation"]["class"]["cmc1"], -i)
    )
    # Past whichever end the grid's best sat on (a grid of two: the best is always an end), by
    # the grid's own ratio 1.0 / 0.3.
    assert weights[2] == (0.09 if grid_best == 0 else 3.33)
    # Progress counted the extra trial in its plan: trial 3 of 3.
    assert any(e.get("candidate") == "class-map" and e.get("trial") == 3 for e in events)
    counted = {e["trials"] for e in events if e.get("candidate") == "class-map" and "trials" in e}
    assert counted == {3}
    assert out.report["auto"]["extra_trials"] == 1


def test_a_skipped_extra_trial_leaves_the_progress_count_exact(
    wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No new value to try (as between neighbouring integers): the plan shrinks, so the last
    # training's index still equals the count reported.
    monkeypatch.setattr(AutoParams, "next_settings", lambda *args, **kwargs: None)
    data = _fixture_data(wordnet_small, labels=True, log=False)
    params = {**TEST_PARAMS, "candidates": ["affine"], "trials": 2}
    events: list[dict] = []
    out = run_backbone_upgrade(
        "auto", data, EuclideanLift(), params=params, hooks=TrainingHooks(events.append)
    )
    (affine,) = [c for c in out.report["candidates"] if c["name"] == "affine"]
    assert len(affine["trials"]) == 2
    training = [e for e in events if e.get("phase") == "training"]
    assert training[-1]["candidate_index"] == training[-1]["candidates"]


def test_a_chosen_candidate_is_served_as_a_method_that_can_be_requested(
    wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate with fixed settings (class-map-mlp) is served as its method with those
    settings in the model's parameters: the stored method is one an explicit request accepts,
    and that request with the stored parameters trains the same kind of model. On the fixture's
    few steps procrustes wins validation, so the choice is made class-map-mlp's here."""
    import app.ml.upgrade.pipeline as pipeline

    real_pick = pipeline.pick

    def pick_class_map_mlp(trials: Any, primary_of: Any) -> tuple[str, dict[str, int]]:
        _, best = real_pick(trials, primary_of)
        return "class-map-mlp", best

    monkeypatch.setattr(pipeline, "pick", pick_class_map_mlp)
    data = _fixture_data(wordnet_small, labels=True, log=False)
    params = {**TEST_PARAMS, "candidates": ["class-map-mlp"], "trials": 1, "extra_trials": 0}
    out = run_backbone_upgrade("auto", data, EuclideanLift(), params=params)
    report = out.report
    assert [c["name"] for c in report["candidates"]] == ["procrustes", "class-map-mlp"]
    assert report["chosen_candidate"] == report["chosen_method"] == "class-map-mlp"
    assert out.method == report["method"] == "class-map" and out.method in BACKBONE_METHODS
    assert out.params["map_hidden"] == 256 and out.params["class_weight"] == 0.3
    assert report["recommendation"]["method"] == "class-map-mlp"
    assert isinstance(out.model, AdapterHead) and out.model.residual_hidden == 256
    explicit = run_backbone_upgrade(out.method, data, EuclideanLift(), params=out.params)
    assert explicit.method == "class-map"
    assert isinstance(explicit.model, AdapterHead) and explicit.model.residual_hidden == 256


def test_widening_never_goes_past_a_structure_axis_ceiling() -> None:
    """Issue 44 item 5: auto tried adapter_rank 4096 and adapter_hidden 16384 on 768 → 384
    dimensions. A step past the ceiling tries the ceiling itself, once; at it, nothing more."""
    from app.ml.auto import widening
    from app.ml.auto.candidates import structure_ceiling

    assert structure_ceiling("adapter_rank", 768, 384) == 384
    assert structure_ceiling("adapter_hidden", 768, 384) == 4 * 768
    assert structure_ceiling("class_weight", 768, 384) is None
    # The best at the high end of (16, 64, 256): one step past is 1024, capped at 384.
    keys = [(True, 0.1), (True, 0.2), (True, 0.3)]
    assert widening.next_value([16, 64, 256], keys, 2, True, None, ceiling=384) == 384
    assert widening.next_value([16, 64, 256, 384], [*keys, (True, 0.4)], 3, True, None, 384) is None
    # Without a ceiling (another axis) the step is the grid's ratio, as before.
    assert widening.next_value([16, 64, 256], keys, 2, True, None) == 1024
    auto = AutoParams.from_dict({"candidates": ["affine"]})
    tried = [{"adapter_rank": v} for v in (64, 16, 256)]
    nxt = auto.next_settings(
        "affine", False, tried, [(True, 0.2), (True, 0.1), (True, 0.3)], 2, (768, 384)
    )
    assert nxt["adapter_rank"] == 384
