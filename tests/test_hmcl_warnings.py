"""The report warns, in plain sentences, when a task's recall is near chance, naming the cause."""

from __future__ import annotations

import numpy as np

from app.ml.hmcl import run_continual_task
from app.ml.hmcl_warnings import chance_recall, likely_causes, near_chance, report_warnings

MINILM, MPNET = "all-MiniLM-L6-v2", "all-mpnet-base-v2"


def _two_encoder_task(wordnet_small: dict, rows: slice) -> dict[str, np.ndarray]:
    # Two encoders: the MiniLM head starts as a random map into MPNet's space, so an untrained
    # model pairs the rows at chance.
    return {
        "image": wordnet_small[f"gloss.{MPNET}"][rows].astype(np.float32),
        "text": wordnet_small[f"lemma.{MINILM}"][rows].astype(np.float32),
    }


def test_chance_helpers() -> None:
    assert chance_recall(200) == 0.025 and chance_recall(3) == 1.0
    assert near_chance(0.05, 0.025) and near_chance(0.07, 0.025)
    assert not near_chance(0.2, 0.025)
    assert likely_causes(50, 10, 5.0, 4.9, 1e-6) == [
        "too few optimizer steps (10; raise epochs or min_steps)",
        "too little data (50 pairs)",
        "a learning rate too low (lr 1e-06: the loss fell by 2 %)",
    ]
    assert likely_causes(500, 500, 5.0, 7.0, 1.0) == [
        "a learning rate too high (lr 1: the loss rose)"
    ]
    assert "do not carry the pairing" in likely_causes(500, 500, 5.0, 1.0, 1e-3)[0]


def test_an_untrained_task_warns_and_names_the_causes(wordnet_small: dict) -> None:
    task = _two_encoder_task(wordnet_small, slice(0, 60))
    result = run_continual_task(
        "finetune", None, task, params={"epochs": 2, "min_steps": 0, "lr": 1e-7}, seed=0
    )
    report = result.report
    assert report["task_recall_at_5"] < 0.2
    (warning,) = report["warnings"]
    assert warning.startswith("Recall@5 on this task's own pairs (60) is ")
    assert "near chance (0.083)" in warning
    assert "too few optimizer steps (2; raise epochs or min_steps)" in warning
    assert "too little data (60 pairs)" in warning
    assert "a learning rate too low (lr 1e-07" in warning


def test_a_trained_task_does_not_warn(wordnet_small: dict) -> None:
    task = _two_encoder_task(wordnet_small, slice(0, 200))
    result = run_continual_task("hmcl-ca", None, task, params={"dim": 96}, seed=0)
    assert result.report["task_recall_at_5"] > 0.9
    assert result.report["warnings"] == []


def test_earlier_tasks_near_chance_are_named() -> None:
    report = {
        "params": {"lr": 5e-4},
        "rows": 400,
        "steps": 300,
        "loss_first": 5.0,
        "loss_last": 1.0,
        "eval_tasks": {
            "t1": {"rows": 100, "recall_at_5_parent": 0.8, "recall_at_5_new": 0.06},
            "t2": {"rows": 100, "recall_at_5_parent": 0.7, "recall_at_5_new": 0.65},
        },
    }
    (warning,) = report_warnings(report, task_recall=0.9, recall_rows=400)
    assert warning == (
        "Recall@5 on earlier task 't1' is 0.060 after this task, near chance (0.050; was 0.800); "
        "likely cause: this update forgot it (it was above chance before)."
    )
