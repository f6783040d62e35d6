"""What the recorded rotation guarantees: the least-squares-best orthogonal R over every old row,
its reported residual, and the Lorentz bound a mapped query obeys (per version and chained)."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

from app.ml.geometry.lorentz import lorentz_distance
from app.ml.hmcl import map_query_to_ancestor, run_continual_task

MINILM = "all-MiniLM-L6-v2"
MODALITIES = ("lemma", "gloss")
FAST = {"epochs": 3, "batch_size": 128, "min_steps": 0, "dim": 64, "lr": 5e-3}


def _tasks(wordnet_small: dict) -> list[dict[str, np.ndarray]]:
    thirds = np.array_split(np.random.default_rng(0).permutation(800), 3)
    return [{m: wordnet_small[f"{m}.{MINILM}"][rows] for m in MODALITIES} for rows in thirds]


def _rows(model, tasks: list[dict]) -> np.ndarray:
    """Every row of the given tasks and modalities, embedded by ``model`` (float64)."""
    return np.concatenate([model.embed(t[m], m) for t in tasks for m in MODALITIES]).astype(float)


def test_procrustes_rotation_is_the_best_fit_and_bounds_mapped_queries(wordnet_small: dict):
    tasks = _tasks(wordnet_small)
    versions = [run_continual_task("finetune", None, tasks[0], params=FAST, seed=0)]
    for t, task in enumerate(tasks[1:], start=1):
        versions.append(
            run_continual_task("hmcl-ca", versions[-1].state, task, params=FAST, seed=t)
        )
    for k in (1, 2):
        parent, child = versions[k - 1].model, versions[k].model
        y_old, y_new = _rows(parent, tasks[:k]), _rows(child, tasks[:k])
        rotation = versions[k].rotation
        # The best orthogonal fit over every earlier row (scipy, rows as vectors: R = Ωᵀ).
        omega, _ = scipy.linalg.orthogonal_procrustes(y_old, y_new)
        assert np.allclose(rotation, omega.T, atol=1e-4)
        residual = np.linalg.norm(y_new - y_old @ rotation.T) / np.linalg.norm(y_old)
        reported = versions[k].report["old_rows_relative_residual"]
        assert abs(reported["procrustes"] - residual) < 1e-4
        assert reported["procrustes"] <= reported["identity"] + 1e-9
        # Each mapped query lies within its Euclidean residual of the parent's embedding.
        mapped = torch.from_numpy(map_query_to_ancestor(y_new, [rotation]))
        dist = lorentz_distance(mapped, torch.from_numpy(y_old), parent.curv).numpy()
        euclid = np.linalg.norm(y_new @ rotation - y_old, axis=1)
        assert np.all(dist <= euclid + 1e-9)
        assert dist.max() > 0  # the bound is not vacuous: the rows did move
    # Chained (version 2 → version 0's gallery): the per-version bounds add up.
    y0, y1, y2 = (_rows(v.model, tasks[:1]) for v in versions)
    r1, r2 = versions[1].rotation, versions[2].rotation
    mapped = torch.from_numpy(map_query_to_ancestor(y2, [r1, r2]))
    dist = lorentz_distance(mapped, torch.from_numpy(y0), 0.1).numpy()
    bound = np.linalg.norm(y1 - y0 @ r1.T, axis=1) + np.linalg.norm(y2 - y1 @ r2.T, axis=1)
    assert np.all(dist <= bound + 1e-6)
