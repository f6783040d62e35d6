"""``auto`` never looks at the evaluation split: replacing every held-out item's features, old
vector and label, and every held-out query (features, old vector, relevant items), by noise leaves
the served model, the choice and every validation trial unchanged — only the held-out figures move.
"""

from __future__ import annotations

import numpy as np
import torch

from app.ml.auto.candidates import split_for_validation
from app.ml.geometry.space import EuclideanLift
from app.ml.upgrade.data import split_for_evaluation, split_queries
from app.ml.upgrade.run import QueryLog, UpgradeData, run_backbone_upgrade
from bench.common.wordnet import NEW_MODEL, OLD_MODEL

SEED = 0
EVAL_FRACTION = 0.2
# Candidates that read each kind of data: labels (class-map), query pairs (instance-map), and the
# closed form (procrustes, always tried); two trials each (so the choice among them is compared)
# and one epoch keep the two runs short.
PARAMS = {"epochs": 1, "candidates": ["instance-map", "class-map"], "trials": 2}


def _data(wordnet_small: dict) -> UpgradeData:
    """Every other synset of the fixture (400, all 16 classes): the two runs stay short."""
    rows = np.arange(0, len(wordnet_small["label"]), 2)
    queries = QueryLog(
        features=wordnet_small[f"lemma.{NEW_MODEL}"][rows],
        old_vectors=wordnet_small[f"lemma.{OLD_MODEL}"][rows],
        relevant=[np.array([i]) for i in range(rows.size)],
    )
    labels = np.unique(wordnet_small["label"][rows], return_inverse=True)[1]
    return UpgradeData(
        wordnet_small[f"gloss.{NEW_MODEL}"][rows],
        wordnet_small[f"gloss.{OLD_MODEL}"][rows],
        labels,
        queries,
    )


def _noise(rng: np.random.Generator, like: np.ndarray) -> np.ndarray:
    """Unit-norm Gaussian rows of ``like``'s shape (the fixture's vectors are unit-norm too)."""
    x = rng.standard_normal(like.shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _perturbed(data: UpgradeData, seed: int) -> tuple[UpgradeData, np.ndarray, np.ndarray]:
    """A copy whose held-out items and held-out queries are noise. Labels are redrawn from the
    existing classes and a held-out query's relevant items from the held-out items, so the split
    itself (which depends on which rows are held out, not on their content) is the same."""
    rng = np.random.default_rng(123)
    _, eval_idx = split_for_evaluation(len(data), EVAL_FRACTION, seed)
    _, eval_q = split_queries(data.queries, eval_idx, EVAL_FRACTION, seed)
    assert data.queries is not None and data.labels is not None
    assert data.queries.old_vectors is not None and data.queries.relevant is not None
    new, old, labels = data.new_features.copy(), data.old_vectors.copy(), data.labels.copy()
    new[eval_idx] = _noise(rng, new[eval_idx])
    old[eval_idx] = _noise(rng, old[eval_idx])
    labels[eval_idx] = rng.choice(np.unique(data.labels), eval_idx.size)
    q_new = data.queries.features.copy()
    q_old = data.queries.old_vectors.copy()
    relevant = list(data.queries.relevant)
    q_new[eval_q] = _noise(rng, q_new[eval_q])
    q_old[eval_q] = _noise(rng, q_old[eval_q])
    for i in eval_q:
        relevant[i] = np.sort(rng.choice(eval_idx, 1 + int(rng.integers(3)), replace=False))
    queries = QueryLog(features=q_new, old_vectors=q_old, relevant=relevant)
    # The split is the same on the perturbed data (else the comparison below is meaningless).
    assert np.array_equal(split_queries(queries, eval_idx, EVAL_FRACTION, seed)[1], eval_q)
    return UpgradeData(new, old, labels, queries), eval_idx, eval_q


def _state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def test_held_out_data_never_influences_selection_or_the_served_model(
    wordnet_small: dict,
) -> None:
    data = _data(wordnet_small)
    noisy, eval_idx, eval_q = _perturbed(data, SEED)
    assert eval_idx.size > 0 and eval_q.size > 0
    # The perturbation touches every held-out row and no other.
    changed = np.flatnonzero((noisy.new_features != data.new_features).any(axis=1))
    assert np.array_equal(changed, eval_idx)

    runs = [
        run_backbone_upgrade(
            "auto", d, EuclideanLift(), params=PARAMS, seed=SEED, eval_fraction=EVAL_FRACTION
        )
        for d in (data, noisy)
    ]
    clean, perturbed = (r.report for r in runs)
    assert clean["n_eval"] == perturbed["n_eval"] == eval_idx.size
    # The choice and the served model's parameters.
    assert runs[0].method == runs[1].method
    assert clean["chosen_method"] == perturbed["chosen_method"]
    a, b = _state(runs[0].model), _state(runs[1].model)
    assert a.keys() == b.keys() and a
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    # Every candidate's every validation trial, its settings and the chosen setting.
    assert [c["name"] for c in clean["candidates"]] == [c["name"] for c in perturbed["candidates"]]
    assert len(clean["candidates"]) == 3
    for c, p in zip(clean["candidates"], perturbed["candidates"], strict=True):
        assert c["chosen_settings"] == p["chosen_settings"], c["name"]
        assert c["validation"] == p["validation"], c["name"]
        assert c["trials"] == p["trials"], c["name"]
        assert all(t["validation"] for t in c["trials"]), c["name"]  # measured, not empty
    assert clean["auto"] == perturbed["auto"]
    # The perturbation reached the held-out figures: the comparison above is not vacuous.
    chosen = clean["chosen_method"]
    assert clean["metrics"][chosen] != perturbed["metrics"][chosen]


def test_the_same_noise_on_validation_items_changes_the_validation_trials(
    wordnet_small: dict,
) -> None:
    """The control: noise on the old vectors of the items validation measures on (part of the
    training split) does show in the trials the test above compares."""
    data = _data(wordnet_small)
    train_idx, _ = split_for_evaluation(len(data), EVAL_FRACTION, SEED)
    split = split_for_validation(train_idx, SEED)
    assert split is not None
    _, val_idx = split
    old = data.old_vectors.copy()
    old[val_idx] = _noise(np.random.default_rng(123), old[val_idx])
    params = {**PARAMS, "candidates": [], "trials": 1}  # procrustes alone
    clean, noisy = (
        run_backbone_upgrade(
            "auto", d, EuclideanLift(), params=params, seed=SEED, eval_fraction=EVAL_FRACTION
        ).report["candidates"]
        for d in (data, UpgradeData(data.new_features, old, data.labels, data.queries))
    )
    assert clean[0]["name"] == noisy[0]["name"] == "procrustes"
    assert clean[0]["trials"] != noisy[0]["trials"]
