"""Plasticity: nothing is corrected or anchored where nothing is protected, and small tasks get
enough optimizer steps to learn (mini-batches, a minimum number of steps per task)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.ml.hmcl import METHODS, ContinualParams, TaskTrainer, run_continual_task
from app.ml.hmcl.metrics import symmetric_recall_at_k

MINILM, MPNET = "all-MiniLM-L6-v2", "all-mpnet-base-v2"


def _split(wordnet_small: dict, n_train: int, n_test: int) -> tuple[dict, dict]:
    """Text = MiniLM lemma (384), image = MPNet gloss (768): two encoders, so the heads start
    from a random semi-orthogonal map for one modality and must learn the pairing."""
    perm = np.random.default_rng(0).permutation(len(wordnet_small["lemma." + MINILM]))
    feats = {
        "image": wordnet_small[f"gloss.{MPNET}"].astype(np.float32),
        "text": wordnet_small[f"lemma.{MINILM}"].astype(np.float32),
    }
    train, test = perm[:n_train], perm[n_train : n_train + n_test]
    return {m: x[train] for m, x in feats.items()}, {m: x[test] for m, x in feats.items()}


def test_first_task_is_plain_training_for_every_method(wordnet_small: dict) -> None:
    """Nothing protected yet: no correction, no anchoring, no penalty — every method trains the
    first task exactly as fine-tuning does."""
    train, _ = _split(wordnet_small, 120, 0)
    params = {"epochs": 3, "min_steps": 0, "batch_size": 64, "dim": 64}
    results = {m: run_continual_task(m, None, train, params=params, seed=3) for m in METHODS}
    reference = results["finetune"].state.heads
    for method, result in results.items():
        for name, weight in result.state.heads.items():
            assert torch.equal(weight, reference[name]), method
        assert result.report["correction_seconds"] == 0.0
        assert "protected" not in result.report
        assert np.array_equal(result.rotation, np.eye(64))
    trainer = TaskTrainer("hmcl-ca", None, train, params=params)
    assert trainer.geometry is None and not trainer.ewc_active


def test_steps_scale_with_the_data(wordnet_small: dict) -> None:
    """One step per mini-batch, at least ``min_steps`` per task: small tasks get more epochs."""
    small, _ = _split(wordnet_small, 100, 0)
    large, _ = _split(wordnet_small, 800, 0)
    defaults = ContinualParams()
    assert TaskTrainer("finetune", None, small).planned_epochs == defaults.min_steps
    trainer = TaskTrainer("finetune", None, large, params={"batch_size": 100, "min_steps": 0})
    assert trainer.batches_per_epoch == 8 and trainer.planned_epochs == defaults.epochs
    trainer.epoch()
    assert trainer.steps_done == 8 and trainer.epochs_done == 1
    busy = TaskTrainer("finetune", None, large, params={"batch_size": 100, "min_steps": 400})
    assert busy.planned_epochs == 50
    with pytest.raises(ValueError, match="min_steps"):
        ContinualParams.from_dict({"min_steps": -1})


def test_a_small_first_task_trains_well_above_chance_with_defaults(wordnet_small: dict) -> None:
    """200 pairs (the README's walk-through size) with default parameters: held-out recall@5
    far above chance (5/200), and the task's own pairs learnt."""
    train, test = _split(wordnet_small, 200, 200)
    result = run_continual_task("hmcl-ca", None, train, seed=0)
    model = result.model
    held_out = symmetric_recall_at_k({m: model.embed(x, m) for m, x in test.items()}, model.curv)
    seen = symmetric_recall_at_k({m: model.embed(x, m) for m, x in train.items()}, model.curv)
    assert result.report["steps"] >= ContinualParams().min_steps
    assert held_out > 8 * 5 / 200, held_out
    assert seen > 0.9, seen
