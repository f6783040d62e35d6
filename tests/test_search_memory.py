"""Issue 45 item 6: what one search holds besides its answer is bounded (the soak bench's
server memory check found a streamed 1,000 × k = 1,000 search growing the server by > 1 GiB:
float64 copies of every hit's point, and a re-rank budget of 256 MiB per array)."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np

from app.search import service, streaming
from app.search.service import SearchQuery, hit_scores
from app.vectors.rerank import RERANK_BUDGET


def _old_hit_scores(queries: np.ndarray, points: np.ndarray) -> np.ndarray:
    q = np.asarray(queries, dtype=np.float64)[:, None, :]
    x = points.astype(np.float64)
    norms = np.linalg.norm(q, axis=-1) * np.linalg.norm(x, axis=-1)
    dots = np.einsum("qkd,qkd->qk", np.broadcast_to(q, x.shape), x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)


def test_hit_scores_hold_a_bounded_block_not_a_float64_copy_of_every_point() -> None:
    rng = np.random.default_rng(0)
    nq, k, d = 60, 1000, 385
    queries = rng.normal(size=(nq, d))
    points = rng.normal(size=(nq, k, d)).astype(np.float32)
    points[0, 0] = 0.0  # a zero vector: cosine 0
    gallery = SimpleNamespace(bound_model_id=None, metric="cosine", lift_curv=1.0)
    tracemalloc.start()
    scores = hit_scores(gallery, queries, points, np.zeros((nq, k)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # A float64 copy of every point alone would be 2 × points.nbytes (185 MiB here); a block is
    # a float64 copy of SCORE_BLOCK_VALUES values and its squares, whatever the input's size.
    assert peak < 3 * 8 * service.SCORE_BLOCK_VALUES, peak / 2**20
    assert peak < points.nbytes, peak / 2**20
    assert scores[0, 0] == 0.0
    assert np.allclose(scores, _old_hit_scores(queries, points), rtol=0, atol=1e-12)


def test_a_streamed_chunk_is_bounded_by_its_points_bytes_as_well_as_by_hits() -> None:
    settings = SimpleNamespace(max_hits_per_request=200_000)
    query = SearchQuery(np.zeros((1000, 384), dtype=np.float32), 1000)
    parts = streaming.chunks(settings, query)
    per = len(parts[0].vectors)
    assert per * 1000 * 385 * 4 <= streaming.CHUNK_POINT_BYTES
    assert sum(len(p.vectors) for p in parts) == 1000
    # Small k: the hits bound is the tighter one.
    small = streaming.chunks(
        SimpleNamespace(max_hits_per_request=50), SearchQuery([[0.0]] * 23, 10)
    )
    assert [len(p.vectors) for p in small] == [5, 5, 5, 5, 3]


def test_the_rerank_budget_and_the_score_blocks_stay_small() -> None:
    assert RERANK_BUDGET * 8 <= 64 * 2**20
    assert service.SCORE_BLOCK_VALUES * 8 <= 64 * 2**20
