"""One continual method trained over a stream and scored: the accuracy matrix and its per-kind
figures, and (on a full run) the drift and no-backfill figures of every old task. The unit of
work of ``bench.quality.continual`` (a selection trial or a seed's test-side run)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from app.ml.hmcl import map_query_to_ancestor, run_continual_task
from app.ml.hmcl.metrics import (
    DRIFT_MEASURES,
    drift_measures,
    nearest_class_accuracy,
    paired_recall_at_k,
    symmetric_recall_at_k,
)
from bench.quality.continual_stream import GLOSS, KINDS, MODALITIES, RETRIEVAL, TEXT, Task

DRIFT_ANCHORS = 300  # test rows per old task used for the drift measures


def evaluate(model, task: Task) -> float:
    """Retrieval: symmetric recall@5 text↔gloss on the test pairs. Classification: accuracy of
    the test glosses' nearest class-name text among the task's classes."""
    if task.kind == RETRIEVAL:
        emb = {m: model.embed(task.test[m], m) for m in MODALITIES}
        return symmetric_recall_at_k(emb, model.curv, k=5)
    glosses = model.embed(task.test[GLOSS], GLOSS)
    names = model.embed(task.class_names, TEXT)
    return nearest_class_accuracy(glosses, names, task.test_labels, model.curv)


def kind_figures(matrix: np.ndarray, kinds: Sequence[str]) -> dict[str, dict[str, float]]:
    """matrix[t, i] = performance on task i after task t (i ≤ t). Per kind of task: task-end
    (mean of matrix[i, i]), final (mean of the last row), BWT (mean over tasks before the last of
    final − task-end) and Overall (mean over t of the mean over that kind's tasks i ≤ t)."""
    n = len(matrix)
    out = {}
    for kind in sorted(set(kinds)):
        cols = [i for i, k in enumerate(kinds) if k == kind]
        old = [i for i in cols if i < n - 1]
        per_t = [np.mean([matrix[t, i] for i in cols if i <= t]) for t in range(n) if cols[0] <= t]
        out[kind] = {
            "task_end": float(np.mean([matrix[i, i] for i in cols])),
            "final": float(np.mean([matrix[-1, i] for i in cols])),
            "bwt": float(np.mean([matrix[-1, i] - matrix[i, i] for i in old])) if old else 0.0,
            "overall": float(np.mean(per_t)),
        }
    return out


def no_backfill(task: Task, version, final, rotations: Sequence[np.ndarray]) -> dict[str, float]:
    """An old task searched without re-embedding its stored side (glosses by ``version``).

    Retrieval: the final model's lemma queries → the stored glosses, recall@5. Classification:
    each stored gloss's nearest class-name text, the names embedded by the final model. Each
    as a fraction of the same figure at the task's end; ``recorded_rotation`` maps the final
    model's text embeddings back through the recorded rotations, ``backfilled`` re-embeds the
    glosses with the final model (what the product avoids)."""
    curv = final.curv
    stored = version.embed(task.test[GLOSS], GLOSS)
    refreshed = final.embed(task.test[GLOSS], GLOSS)
    if task.kind == RETRIEVAL:
        texts = task.test[TEXT]

        def score(queries: np.ndarray, gallery: np.ndarray) -> float:
            return paired_recall_at_k(queries, gallery, curv)

    else:
        texts = task.class_names

        def score(queries: np.ndarray, gallery: np.ndarray) -> float:
            return nearest_class_accuracy(gallery, queries, task.test_labels, curv)

    task_end = score(version.embed(texts, TEXT), stored)
    query = final.embed(texts, TEXT)
    values = {
        "plain": score(query, stored),
        "recorded_rotation": score(map_query_to_ancestor(query, rotations), stored),
        "backfilled": score(query, refreshed),
    }
    out = {"task_end": task_end}
    for name, v in values.items():
        out[name] = v / task_end if task_end > 0 else float("nan")
    return out


def old_task_figures(
    tasks: Sequence[Task], versions: Sequence[Any], rotations: Sequence[np.ndarray]
) -> dict[str, Any]:
    """The drift and no-backfill figures of every task before the last, on ``tasks``' test
    rows, ``versions[i]`` being the model at task i's end and ``versions[-1]`` the final one."""
    final = versions[-1]
    drift: dict[str, list[float]] = {k: [] for k in DRIFT_MEASURES}
    kept: dict[str, dict[str, list[float]]] = {k: {} for k in KINDS}
    for i in range(len(tasks) - 1):
        test = {m: tasks[i].test[m][:DRIFT_ANCHORS] for m in MODALITIES}
        before = {m: versions[i].embed(test[m], m) for m in MODALITIES}
        after = {m: final.embed(test[m], m) for m in MODALITIES}
        for k, v in drift_measures(before, after, final.curv).items():
            drift[k].append(v)
        for k, v in no_backfill(tasks[i], versions[i], final, rotations[i + 1 :]).items():
            kept[tasks[i].kind].setdefault(k, []).append(v)
    return {
        "drift": {k: float(np.mean(v)) for k, v in drift.items()},
        "no_backfill": {
            kind: {k: float(np.mean(v)) for k, v in figures.items()}
            for kind, figures in kept.items()
            if figures
        },
    }


def run_method(
    method: str,
    tasks: Sequence[Task],
    params: Mapping[str, Any],
    seed: int,
    full: bool = True,
    held_back: Sequence[Task] | None = None,
) -> dict[str, Any]:
    """Train the stream with one method and score it; ``full=False`` (settings selection) skips
    the drift and no-backfill figures. ``held_back`` (the same tasks with held-back test rows):
    the same trained versions also scored on those, under ``"held_back"``."""
    n = len(tasks)
    kinds = [t.kind for t in tasks]
    matrix = np.full((n, n), np.nan)
    state, versions, rotations, warnings = None, [], [], []
    steps = 0
    tic = time.perf_counter()
    for t, task in enumerate(tasks):
        result = run_continual_task(
            method, state, task.train, task.train_labels, params=params, seed=seed * 1000 + t
        )
        state = result.state
        versions.append(result.model)
        rotations.append(result.rotation)
        steps += result.report["steps"]
        warnings += [f"task {t + 1}: {w}" for w in result.report["warnings"]]
        for i in range(t + 1):
            matrix[t, i] = evaluate(result.model, tasks[i])
    out: dict[str, Any] = {
        "by_kind": kind_figures(matrix, kinds),
        "matrix": matrix.tolist(),
        "steps": steps,
        "train_seconds": time.perf_counter() - tic,
        "warnings": warnings,
    }
    if not full:
        return out
    out.update(old_task_figures(tasks, versions, rotations))
    if held_back is not None:
        held = np.full((n, n), np.nan)
        for t in range(n):
            for i in range(t + 1):
                held[t, i] = evaluate(versions[t], held_back[i])
        out["held_back"] = {
            "by_kind": kind_figures(held, kinds),
            "matrix": held.tolist(),
            "steps": steps,
            "warnings": warnings,
            **old_task_figures(held_back, versions, rotations),
        }
    return out
