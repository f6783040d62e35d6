"""The report warns, in plain sentences, when a task's recall (one-to-one pairs) or class accuracy
(classification-style pairs) is near chance, naming the cause."""

from __future__ import annotations

import numpy as np
import pytest

from app.ml.hmcl import run_continual_task
from app.ml.hmcl.metrics import class_pairing
from app.ml.hmcl.report_warnings import (
    chance_accuracy,
    chance_recall,
    likely_causes,
    near_chance,
    report_warnings,
)

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


def _classification_task(
    wordnet_small: dict, rows: slice, gloss_model: str
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    # Many glosses ↔ one class-name text: the text rows repeat their class's lemma embedding.
    class_index = {c: k for k, c in enumerate(wordnet_small["classes"])}
    labels = np.array([class_index[lab] for lab in wordnet_small["label"][rows]])
    task = {
        "text": wordnet_small[f"class_lemma.{MINILM}"][labels].astype(np.float32),
        "gloss": wordnet_small[f"gloss.{gloss_model}"][rows].astype(np.float32),
    }
    return task, labels


def test_class_pairing_reads_classification_style_rows(wordnet_small: dict) -> None:
    task, labels = _classification_task(wordnet_small, slice(0, 800), MINILM)
    pairing = class_pairing(task)
    assert pairing is not None
    assert (pairing.class_modality, pairing.query_modality) == ("text", "gloss")
    # 16 fine labels, 13 distinct name texts: labels of different lexicographer files can share
    # an ancestor (one text), and only texts can be told apart.
    assert len(np.unique(labels)) == 16
    assert pairing.classes == len(np.unique(task["text"], axis=0)) == 13
    # Every row's class row holds its text, and rows of one label share one class.
    np.testing.assert_array_equal(task["text"][pairing.class_rows][pairing.labels], task["text"])
    assert len({(a, b) for a, b in zip(pairing.labels, labels, strict=True)}) == 16
    # One-to-one pairs (lemma ↔ gloss) are not classification-style.
    assert class_pairing(_two_encoder_task(wordnet_small, slice(0, 200))) is None
    assert chance_accuracy(16) == 1 / 16


def test_an_untrained_classification_task_warns_on_accuracy(wordnet_small: dict) -> None:
    # MPNet glosses against MiniLM class names: the untrained heads classify at chance.
    task, labels = _classification_task(wordnet_small, slice(0, 800), MPNET)
    result = run_continual_task(
        "finetune", None, task, labels, params={"epochs": 1, "min_steps": 0, "lr": 1e-7}, seed=0
    )
    report = result.report
    own = report["task_class_accuracy"]
    assert own["classes"] == 13 and own["rows"] == 800 and own["class_modality"] == "text"
    assert own["accuracy"] < 2 / 13
    (warning,) = report["warnings"]  # the accuracy, not the (meaningless) recall, is reported
    assert warning.startswith("Class accuracy on this task's own rows (800 rows, 13 classes) is ")
    assert "near chance (0.077)" in warning
    assert "too few optimizer steps (4; raise epochs or min_steps)" in warning
    assert "a learning rate too low (lr 1e-07" in warning


def test_a_trained_classification_task_does_not_warn(wordnet_small: dict) -> None:
    task, labels = _classification_task(wordnet_small, slice(0, 800), MINILM)
    result = run_continual_task(
        "finetune", None, task, labels, params={"dim": 96, "min_steps": 40, "epochs": 1}, seed=0
    )
    assert result.report["task_class_accuracy"]["accuracy"] > 0.5
    assert result.report["warnings"] == []
    # A one-to-one task has no class accuracy.
    plain = run_continual_task(
        "finetune",
        None,
        _two_encoder_task(wordnet_small, slice(0, 100)),
        params={"epochs": 1, "min_steps": 0},
    )
    assert plain.report["task_class_accuracy"] is None


def test_an_earlier_classification_task_reports_accuracy_before_and_after(
    wordnet_small: dict,
) -> None:
    first, labels = _classification_task(wordnet_small, slice(0, 400), MINILM)
    params = {"dim": 64, "min_steps": 20, "epochs": 1}
    base = run_continual_task("finetune", None, first, labels, params=params, seed=0)
    second, labels2 = _classification_task(wordnet_small, slice(400, 800), MINILM)
    after = run_continual_task(
        "hmcl-ca", base.state, second, labels2, params=params, eval_tasks={"t1": first}
    )
    old = after.report["eval_tasks"]["t1"]
    assert old["classes"] == len(np.unique(first["text"], axis=0))
    assert old["class_accuracy_parent"] == pytest.approx(
        base.report["task_class_accuracy"]["accuracy"]
    )
    assert 0.0 <= old["class_accuracy_new"] <= 1.0


def test_earlier_classification_tasks_near_chance_are_named_by_accuracy() -> None:
    report = {
        "params": {"lr": 5e-4},
        "rows": 400,
        "steps": 300,
        "loss_first": 5.0,
        "loss_last": 1.0,
        "task_class_accuracy": {"accuracy": 0.08, "classes": 20, "rows": 400},
        "eval_tasks": {
            "c1": {
                "rows": 300,
                "classes": 20,
                "recall_at_5_parent": 0.01,  # not read for a classification-style task
                "recall_at_5_new": 0.01,
                "class_accuracy_parent": 0.6,
                "class_accuracy_new": 0.07,
            },
            "c2": {
                "rows": 300,
                "classes": 20,
                "recall_at_5_parent": 0.01,
                "recall_at_5_new": 0.01,
                "class_accuracy_parent": 0.6,
                "class_accuracy_new": 0.5,
            },
        },
    }
    own, old = report_warnings(report, task_recall=0.9, recall_rows=400)
    assert own == (
        "Class accuracy on this task's own rows (400 rows, 20 classes) is 0.080, near chance "
        "(0.050); likely cause: features that do not carry the pairing (the loss fell, recall "
        "did not)."
    )
    assert old == (
        "Class accuracy on earlier task 'c1' is 0.070 after this task, near chance (0.050; was "
        "0.600); likely cause: this update forgot it (it was above chance before)."
    )
