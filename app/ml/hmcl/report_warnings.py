"""Plain-sentence warnings for a continual task's report: recall (one-to-one pairs) or class
accuracy (classification-style pairs: many rows ↔ one class text) near chance, with the likely
cause read off the run (steps, data, how the loss moved)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Fewer optimizer steps or pairs than this is named as a likely cause of a near-chance result.
FEW_STEPS = 100
FEW_ROWS = 100
# The loss falling by less than this fraction of its first value reads as a learning rate too low.
STALLED_LOSS = 0.1


def chance_recall(rows: int, k: int = 5) -> float:
    """Recall@k of a random ranking of ``rows`` gallery items: k / rows (at most 1)."""
    return min(1.0, k / max(rows, 1))


def chance_accuracy(classes: int) -> float:
    """Accuracy of guessing one of ``classes`` classes at random: 1 / classes."""
    return 1.0 / max(classes, 1)


def near_chance(value: float, chance: float) -> bool:
    """Within a factor 2 of chance, or 0.05 above it, whichever is larger."""
    return value <= max(2.0 * chance, chance + 0.05)


def likely_causes(
    rows: int, steps: int, loss_first: float | None, loss_last: float | None, lr: float
) -> list[str]:
    causes = []
    if steps < FEW_STEPS:
        causes.append(f"too few optimizer steps ({steps}; raise epochs or min_steps)")
    if rows < FEW_ROWS:
        causes.append(f"too little data ({rows} pairs)")
    if loss_first is not None and loss_last is not None:
        if not math.isfinite(loss_last) or loss_last > loss_first:
            causes.append(f"a learning rate too high (lr {lr:g}: the loss rose)")
        elif loss_first - loss_last < STALLED_LOSS * abs(loss_first):
            drop = 100 * (loss_first - loss_last) / abs(loss_first) if loss_first else 0.0
            causes.append(f"a learning rate too low (lr {lr:g}: the loss fell by {drop:.0f} %)")
    if not causes:
        causes.append("features that do not carry the pairing (the loss fell, recall did not)")
    return causes


def report_warnings(report: Mapping[str, Any], task_recall: float, recall_rows: int) -> list[str]:
    """Warnings for a finished task's report, when a figure is near chance: its own class
    accuracy (``report["task_class_accuracy"]``, set for a classification-style task) or else
    its recall@5 (on ``recall_rows`` of its pairs), and every earlier task's, the same way."""
    params = report["params"]
    causes = likely_causes(
        report["rows"], report["steps"], report["loss_first"], report["loss_last"], params["lr"]
    )
    warnings = []
    own = report.get("task_class_accuracy")
    if own:
        chance = chance_accuracy(own["classes"])
        if near_chance(own["accuracy"], chance):
            warnings.append(
                f"Class accuracy on this task's own rows ({own['rows']} rows, {own['classes']} "
                f"classes) is {own['accuracy']:.3f}, near chance ({chance:.3f}); likely cause: "
                f"{'; '.join(causes)}."
            )
    else:
        chance = chance_recall(recall_rows)
        if near_chance(task_recall, chance):
            warnings.append(
                f"Recall@5 on this task's own pairs ({recall_rows}) is {task_recall:.3f}, near "
                f"chance ({chance:.3f}); likely cause: {'; '.join(causes)}."
            )
    for name, old in (report.get("eval_tasks") or {}).items():
        if old.get("classes"):
            figure, chance = "Class accuracy", chance_accuracy(old["classes"])
            now, was = old["class_accuracy_new"], old["class_accuracy_parent"]
        else:
            figure, chance = "Recall@5", chance_recall(old.get("rows", 0))
            now, was = old["recall_at_5_new"], old["recall_at_5_parent"]
        if near_chance(now, chance):
            cause = (
                "this update forgot it (it was above chance before)"
                if not near_chance(was, chance)
                else "it was near chance before this task too"
            )
            warnings.append(
                f"{figure} on earlier task {name!r} is {now:.3f} after this task, near chance "
                f"({chance:.3f}; was {was:.3f}); likely cause: {cause}."
            )
    return warnings
