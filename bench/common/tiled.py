"""Benchmark galleries of any size derived from the real WordNet-noun features.

The shared data holds 24,000 synsets, each with a gloss and a lemma text embedded by
all-MiniLM-L6-v2 (384-d, the "old" model) and all-mpnet-base-v2 (768-d, the "new" one): 48,000
real rows per model. A gallery of N rows repeats those rows in order and adds Gaussian noise of
norm ``noise`` (relative to the unit-norm features) to every copy, so that no two rows are
equal; it is real-data-derived, not real data, and the benchmarks say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from app.ml.geometry.space import EuclideanLift
from bench.common.wordnet import FIELDS, NEW_MODEL, OLD_MODEL, load_wordnet

DEFAULT_NOISE = 0.1
BLOCK = 65536


@dataclass
class WordNetRows:
    old: np.ndarray  # 48,000 × 384 float32 (MiniLM, gloss rows then lemma rows)
    new: np.ndarray | None  # 48,000 × 768 float32 (MPNet, same rows); None when not loaded


def wordnet_rows(with_new: bool = True) -> WordNetRows:
    """Gloss then lemma rows of the old model (and of the new one unless ``with_new`` is False:
    the mini fixture folder holds the old model's rows only)."""
    models = (OLD_MODEL, NEW_MODEL) if with_new else (OLD_MODEL,)
    data = load_wordnet(fields=FIELDS, models=models)
    return WordNetRows(
        old=np.concatenate([data.get(f, OLD_MODEL) for f in FIELDS]),
        new=np.concatenate([data.get(f, NEW_MODEL) for f in FIELDS]) if with_new else None,
    )


def tiled(base: np.ndarray, n: int, noise: float = DEFAULT_NOISE, seed: int = 0) -> np.ndarray:
    """``n`` rows: ``base`` repeated in order, each copy plus noise of norm ≈ ``noise``."""
    rng = np.random.default_rng(seed)
    dim = base.shape[1]
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, BLOCK):
        rows = np.arange(start, min(n, start + BLOCK)) % len(base)
        jitter = rng.standard_normal((len(rows), dim), dtype=np.float32)
        out[start : start + len(rows)] = base[rows] + (noise / np.sqrt(dim)) * jitter
    return out


def lift_points(vectors: np.ndarray, lift: EuclideanLift) -> np.ndarray:
    """Space components of ``vectors`` under ``lift`` in float64, as the service computes them
    (``app.vectors.points.lifted_points``), block by block, returned as float32."""
    out = np.empty(vectors.shape, dtype=np.float32)
    for start in range(0, len(vectors), BLOCK):
        block = torch.as_tensor(vectors[start : start + BLOCK], dtype=torch.float64)
        out[start : start + len(block)] = lift(block).numpy()
    return out
