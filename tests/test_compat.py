"""HBCT and the baselines on real features (the committed WordNet fixture)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.ml.evaluation.metrics import neighbour_recall, retrieval_metrics
from app.ml.geometry.lorentz import entailment_violation, exp_map0
from app.ml.geometry.space import EuclideanLift
from app.ml.methods import losses
from app.ml.methods.compat import BACKBONE_METHODS, CompatParams, train_compatible_model
from app.ml.methods.models import model_from_bytes, model_to_bytes
from app.ml.methods.training import TrainingCancelled, TrainingHooks
from app.ml.upgrade.run import UpgradeData, run_backbone_upgrade
from bench.common.wordnet import NEW_MODEL, OLD_MODEL

FAST = {"epochs": 25, "hidden_dim": 128}


@pytest.fixture(scope="module")
def pairs(wordnet_small: dict) -> dict:
    old = wordnet_small[f"gloss.{OLD_MODEL}"]
    new = wordnet_small[f"gloss.{NEW_MODEL}"]
    _, labels = np.unique(wordnet_small["label"], return_inverse=True)
    perm = np.random.default_rng(0).permutation(len(old))
    train, test = perm[:560], perm[560:]
    lift = EuclideanLift()
    old_points = lift(torch.from_numpy(old)).numpy()
    return {
        "old": old,
        "new": new,
        "labels": labels,
        "train": train,
        "test": test,
        "old_points": old_points,
        "lift": lift,
    }


def _train(pairs: dict, method: str, labelled: bool = True, seed: int = 0, **params):
    tr = pairs["train"]
    return train_compatible_model(
        method,
        pairs["new"][tr],
        pairs["old_points"][tr],
        pairs["labels"][tr] if labelled else None,
        1.0,
        {**FAST, **params},
        seed=seed,
    )


def _new_old(pairs: dict, model) -> float:
    te = pairs["test"]
    emb = model.embed(pairs["new"][te])
    return retrieval_metrics(emb, pairs["old_points"][te], pairs["labels"][te], 1.0).cmc1


@pytest.mark.parametrize("method", BACKBONE_METHODS)
def test_every_method_trains_embeds_and_round_trips(pairs: dict, method: str) -> None:
    model = _train(pairs, method)
    x = pairs["new"][pairs["test"][:50]]
    emb = model.embed(x)
    assert emb.shape == (50, 384) and np.isfinite(emb).all()
    np.testing.assert_array_equal(model_from_bytes(model_to_bytes(model)).embed(x), emb)


def test_training_is_deterministic_in_the_seed(pairs: dict) -> None:
    x = pairs["new"][:20]
    a = _train(pairs, "hbct", seed=3, epochs=3).embed(x)
    b = _train(pairs, "hbct", seed=3, epochs=3).embed(x)
    c = _train(pairs, "hbct", seed=4, epochs=3).embed(x)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_compatibility_terms_make_new_queries_search_the_old_gallery(pairs: dict) -> None:
    te = pairs["test"]
    old_old = retrieval_metrics(
        pairs["old_points"][te], pairs["old_points"][te], pairs["labels"][te], 1.0
    ).cmc1
    independent = _new_old(pairs, _train(pairs, "independent"))
    # The old-prototype term (no longer on by default: it costs instance alignment) is the
    # class-level lever this checks.
    hbct = _new_old(pairs, _train(pairs, "hbct", old_proto_weight=3.0))
    # Without compatibility terms the new space is unrelated to the old one (near chance:
    # 1/16); HBCT's queries find same-class old items more often than the old model's own.
    assert independent < 0.2
    assert hbct > old_old


def test_entailment_term_pulls_new_points_toward_old_cones(pairs: dict) -> None:
    # At lift scale 0.3 the old points' cones are wide enough (half-aperture ≈ 42°) to be
    # reachable from new-backbone features; at scale 1 (≈ 10°) they are not.
    tr, te = pairs["train"], pairs["test"]
    old_points = EuclideanLift(scale=0.3)(torch.from_numpy(pairs["old"])).numpy()
    old = torch.from_numpy(old_points[te])

    def violation(method: str) -> float:
        params = {**FAST, "old_proto_weight": 0.0}
        model = train_compatible_model(
            method, pairs["new"][tr], old_points[tr], pairs["labels"][tr], 1.0, params
        )
        new = torch.from_numpy(model.embed(pairs["new"][te]))
        return entailment_violation(old, new, 1.0).mean().item()

    assert violation("hbct") < 0.85 * violation("hbct-noentail")


def test_alignment_weight_moves_the_result(pairs: dict) -> None:
    # Without the old-prototype term, so that the paper's alignment is all that links the spaces.
    weak = _new_old(pairs, _train(pairs, "hbct", compat_weight=0.01, old_proto_weight=0.0))
    strong = _new_old(pairs, _train(pairs, "hbct", compat_weight=1.0, old_proto_weight=0.0))
    assert strong > weak + 0.2


def test_unlabelled_upgrade_keeps_old_neighbourhoods(pairs: dict) -> None:
    te = pairs["test"]
    old = pairs["old_points"][te]

    def recall(method: str) -> float:
        # The served head is linear (hidden_dim 0): with it the result does not hinge on τ.
        model = _train(pairs, method, labelled=False, hidden_dim=0)
        return neighbour_recall(model.embed(pairs["new"][te]), old, 1.0, k=10)

    assert recall("independent") < 0.1
    assert recall("hbct") > 0.3


def test_procrustes_recovers_an_exact_rotation(wordnet_small: dict) -> None:
    """New features that are a rotated copy of the old vectors map back exactly."""
    old = wordnet_small[f"gloss.{OLD_MODEL}"].astype(np.float64)
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(384, 384)))
    new = (old @ q).astype(np.float32)
    lift = EuclideanLift()
    old_points = lift(torch.from_numpy(old.astype(np.float32))).numpy()
    model = train_compatible_model("procrustes", new, old_points, None, 1.0)
    np.testing.assert_allclose(model.embed(new), old_points, atol=2e-4)


def test_raw_rince_is_minimised_by_fleeing_normalised_rince_is_not(pairs: dict) -> None:
    """The hyperbolic escape that row normalisation removes (see ``rince_alignment_loss``)."""
    old = torch.from_numpy(pairs["old_points"][:128]).double()
    # New points far from their partners: every positive's softmax weight is below λ.
    new = torch.from_numpy(pairs["old_points"][128:256]).double()
    values = {}
    for normalise in (False, True):
        values[normalise] = [
            losses.rince_alignment_loss(
                exp_map0(new * s), old, 1.0, 0.1, 0.5, normalise_rows=normalise
            ).item()
            for s in (1.0, 3.0)
        ]
    raw_near, raw_far = values[False]
    norm_near, norm_far = values[True]
    assert raw_far < raw_near  # moving everything away "helps" the raw loss
    assert norm_far >= norm_near - 1e-6  # the normalised loss sees no gain in fleeing


def test_rince_with_small_q_is_info_nce(pairs: dict) -> None:
    old = torch.from_numpy(pairs["old_points"][:64]).double()
    new = exp_map0(old * 1.5 + 0.05)
    info = losses.rince_alignment_loss(new, old, 1.0, 0.1, 0.0)
    near = losses.rince_alignment_loss(new, old, 1.0, 0.1, 2e-3)
    # (λ^q − p^q)/q → −log p + log λ as q → 0.
    assert near.item() == pytest.approx(info.item() + np.log(0.01), rel=0.05)


def test_run_backbone_upgrade_reports_against_procrustes_and_independent(pairs: dict) -> None:
    data = UpgradeData(pairs["new"], pairs["old"], pairs["labels"])
    events: list[dict] = []
    out = run_backbone_upgrade(
        "hbct",
        data,
        pairs["lift"],
        params=FAST,
        eval_fraction=0.25,
        hooks=TrainingHooks(events.append),
    )
    metrics = out.report["metrics"]
    assert set(metrics) == {"stay", "hbct", "procrustes", "independent", "reindex"}
    assert set(metrics["hbct"]) >= {"instance", "class", "arr", "p_com", "p_up", "reference"}
    # Procrustes keeps instances (its own old vector first for most held-out items).
    assert metrics["procrustes"]["instance"]["recall@1"] > 0.8
    assert metrics["procrustes"]["p_com"]["cmc1"] is not None
    assert out.method == "hbct" and out.report["recommendation"]["method"] == "hbct"
    assert events and events[-1]["epoch"] == events[-1]["epochs"]
    assert {e["phase"] for e in events} == {"training", "evaluating"}
    assert [e["epoch"] for e in events if e["candidate"] == "hbct"] == list(range(1, 26))
    assert len(out.report["history"]) == FAST["epochs"]
    assert out.params["epochs"] == FAST["epochs"] and out.report["n_eval"] == 200


def test_cancellation_stops_between_epochs(pairs: dict) -> None:
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(TrainingCancelled):
        train_compatible_model(
            "hbct",
            pairs["new"],
            pairs["old_points"],
            pairs["labels"],
            1.0,
            FAST,
            hooks=TrainingHooks(should_stop=should_stop),
        )
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("params", "labels", "message"),
    [
        ({"epochs": 0}, True, "epochs"),
        ({"lr": "fast"}, True, "lr"),
        ({"no_such": 1}, True, "unknown parameter"),
        ({"uncertainty": "magic"}, True, "uncertainty"),
        ({"uncertainty": "knn"}, False, "needs labels"),
    ],
)
def test_bad_parameters_are_rejected(pairs: dict, params: dict, labels: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _train(pairs, "hbct", labelled=labels, **params)


def test_bad_inputs_are_rejected(pairs: dict) -> None:
    with pytest.raises(ValueError, match="unknown method"):
        _train(pairs, "magic")
    with pytest.raises(ValueError, match="needs labels"):
        _train(pairs, "bct", labelled=False)
    bad = pairs["new"][:100].copy()
    bad[3, 5] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        train_compatible_model("hbct", bad, pairs["old_points"][:100], None, 1.0, FAST)
    with pytest.raises(ValueError, match="eval_fraction"):
        run_backbone_upgrade(
            "hbct", UpgradeData(pairs["new"], pairs["old"]), pairs["lift"], eval_fraction=1.5
        )
    assert CompatParams.from_dict({"lr": 1}).lr == 1.0


@pytest.mark.parametrize(
    "name", ["lr", "weight_decay", "compat_weight", "old_proto_weight", "base_temperature"]
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_parameters_are_refused(name: str, value: float) -> None:
    # JSON bodies can carry NaN/Infinity; a NaN weight_decay used to pass validation and train.
    with pytest.raises(ValueError, match=name):
        CompatParams.from_dict({name: value})
