"""Stage one of a two-stage search without the over-fetch (issue 43's speed target):
``LorentzIndex.search_candidates`` proposes the float32 scan's best ``depth`` rows and re-scores
just those exactly. On real vectors (the fixture's 1,600 MiniLM rows of WordNet glosses and
lemmas, lifted as a cosine gallery is, and a hyperbolic model's points at the radii the service
allows), its candidate set is the exact top-depth set up to float32 ties, and its ids, distances
and cosines are those of the served exact search over the same rows. The batched ranking of the
second stage answers its rule worked candidate by candidate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.ml.backfill.two_stage import FusionScale
from app.ml.geometry.space import EuclideanLift
from app.search import ranking, two_stage
from app.vectors.faiss.index import LorentzIndex
from app.vectors.lorentz_rows import exact_distances, exact_distances_and_cosines

OLD = "all-MiniLM-L6-v2"
NEW = "all-mpnet-base-v2"
# float32 carries 24 bits: the scan's inner products of points of norm ~r are off by a few ulps
# of their size, so only rows this close to the depth-th distance may swap across it.
FLOAT32_TIE = 1e-5


def _rows(wordnet_small: dict, model: str) -> np.ndarray:
    return np.concatenate([wordnet_small[f"gloss.{model}"], wordnet_small[f"lemma.{model}"]])


def _cosine_gallery(wordnet_small: dict, engine: str) -> tuple[LorentzIndex, np.ndarray]:
    """The fixture's MiniLM rows lifted as a cosine gallery's (the service's default lift), ids
    shuffled so that id order is not row order."""
    lift = EuclideanLift()
    points = lift(torch.tensor(_rows(wordnet_small, OLD), dtype=torch.float64)).numpy()
    ids = np.random.default_rng(0).permutation(len(points)).astype(np.int64) * 3 + 7
    index = LorentzIndex.build(
        points.shape[1], lift.curv, "flat", {}, ids, points.astype(np.float32), engine=engine
    )
    return index, points


def _exact_top(index: LorentzIndex, queries: np.ndarray, depth: int):
    """Every row's exact float64 distance from each query, and the exact top-depth ids."""
    rows = index.lifted[:, 1:]
    dist = np.stack([exact_distances(q[None, :], rows, index.curv) for q in queries])
    order = np.lexsort((np.broadcast_to(index.ids, dist.shape), dist), axis=1)[:, :depth]
    return dist, index.ids[order]


@pytest.mark.parametrize("engine", ["torch", "faiss"])
@pytest.mark.parametrize("depth", [10, 200])
def test_candidates_are_the_exact_top_depth_up_to_float32_ties(
    wordnet_small: dict, engine: str, depth: int
) -> None:
    index, points = _cosine_gallery(wordnet_small, engine)
    # Queries: gallery rows (their duplicates are exact ties) and noisy copies of others.
    rng = np.random.default_rng(1)
    pick = rng.choice(len(points), 48, replace=False)
    queries = points[pick].copy()
    queries[24:] += 0.02 * rng.standard_normal(queries[24:].shape)
    found = index.search_candidates(queries, depth, cosines=True)
    dist, exact = _exact_top(index, queries, depth)
    position = {int(v): p for p, v in enumerate(index.ids)}
    swapped = 0
    for q in range(len(queries)):
        got, want = set(found.ids[q].tolist()), set(exact[q].tolist())
        kth = dist[q, position[int(exact[q, -1])]]
        for v in got ^ want:
            # A row in one set only lies at the boundary: within float32 error of the depth-th.
            assert abs(dist[q, position[v]] - kth) <= FLOAT32_TIE * max(1.0, kth), (q, v)
            swapped += 1
        # Distances are the exact ones of the rows returned, nearest first, ties by id.
        want_dist = np.array([dist[q, position[v]] for v in found.ids[q].tolist()])
        np.testing.assert_allclose(found.distances[q], want_dist, rtol=1e-12, atol=1e-15)
        assert (np.diff(found.distances[q]) >= 0).all()
    assert swapped <= len(queries)  # at most a tie here and there
    # Against the served exact search at the depth (over-fetched): the same ids wherever the
    # sets agree, the same distances, and cosines as the service's hit scores compute them.
    ids, served, served_points = index.search_with_points(
        queries, depth, overfetch=4, min_candidates=64
    )
    same = [q for q in range(len(queries)) if set(ids[q]) == set(found.ids[q])]
    assert len(same) >= len(queries) - swapped
    np.testing.assert_array_equal(found.ids[same], ids[same])
    np.testing.assert_allclose(found.distances[same], served[same], rtol=1e-12, atol=1e-15)
    x = served_points.astype(np.float64)
    cos = np.einsum("qkd,qd->qk", x, queries) / (
        np.linalg.norm(x, axis=-1) * np.linalg.norm(queries, axis=-1)[:, None]
    )
    np.testing.assert_allclose(found.cosines[same], cos[same], rtol=1e-12, atol=1e-14)


def test_candidates_far_from_the_origin_and_padding(wordnet_small: dict) -> None:
    """A model-bound gallery's points (space components, no lift) at radius up to 5 — the
    service's bound — and a depth above the gallery's size: −1 / inf padded, no cosines asked."""
    rows = _rows(wordnet_small, NEW)[:300].astype(np.float64)
    rng = np.random.default_rng(2)
    radius = rng.uniform(0.5, 5.0, (len(rows), 1))
    units = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    points = np.sinh(radius) * units  # curvature 1: the space part of a point at that radius
    index = LorentzIndex.build(points.shape[1], 1.0, "flat", {}, np.arange(300), points)
    queries = points[:8] + 0.01 * rng.standard_normal((8, points.shape[1]))
    found = index.search_candidates(queries, 40)
    assert found.cosines is None
    dist, exact = _exact_top(index, queries, 40)
    for q in range(8):
        kth = dist[q, exact[q, -1]]
        for v in set(found.ids[q].tolist()) ^ set(exact[q].tolist()):
            assert abs(dist[q, v] - kth) <= FLOAT32_TIE * max(1.0, kth)
    padded = index.search_candidates(queries[:2], 310, cosines=True)
    assert (padded.ids[:, 300:] == -1).all() and np.isinf(padded.distances[:, 300:]).all()
    assert (padded.cosines[:, 300:] == 0).all()
    assert sorted(padded.ids[0, :300].tolist()) == list(range(300))
    empty = LorentzIndex(4, 1.0).search_candidates(np.zeros((3, 4)), 5)
    assert (empty.ids == -1).all() and empty.ids.shape == (3, 5)


def test_distances_and_cosines_share_the_exact_formula() -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 1, 16))
    x = rng.standard_normal((5, 30, 16)) * 3
    x[0, 0] = 0.0  # the origin: no direction, cosine 0
    dist, cos = exact_distances_and_cosines(q, x, 0.7)
    np.testing.assert_array_equal(dist, exact_distances(q, x, 0.7))
    with np.errstate(invalid="ignore"):
        want = np.einsum("qkd,qkd->qk", np.broadcast_to(q, x.shape), x) / (
            np.linalg.norm(q, axis=-1) * np.linalg.norm(x, axis=-1)
        )
    want[0, 0] = 0.0
    np.testing.assert_allclose(cos, want, rtol=1e-12, atol=1e-15)


def _ranked_one_by_one(
    ids: np.ndarray,
    distances: np.ndarray,
    old_scores: np.ndarray,
    query_features: np.ndarray,
    vectors: two_stage.NewVectors,
    k: int,
    fusion: two_stage.Fusion | None,
) -> list[list[tuple[int, float, float, bool]]]:
    """The second stage's rule, candidate by candidate in plain Python: the candidates with a
    new vector by the new cosine (or the fused score), ties in the index's order, then the
    others in the index's order; padded candidates (id −1) skipped."""
    out = []
    for q in range(ids.shape[0]):
        query = (query_features[q] / np.linalg.norm(query_features[q])).astype(np.float32)
        keyed, old_hits = [], []
        for col in range(ids.shape[1]):
            item = int(ids[q, col])
            if item < 0:
                continue
            old_score = float(old_scores[q, col])
            at = int(vectors.positions(np.array([item]))[0])
            if at < 0:
                old_hits.append((item, float(distances[q, col]), old_score, False))
                continue
            cos = float(np.dot(vectors.rows[at], query))  # a float32 product, as served
            key = cos
            if fusion is not None:
                sc = fusion.scale
                key = fusion.weight * (old_score - sc.old_mean) / sc.old_std
                key += (1 - fusion.weight) * (cos - sc.new_mean) / sc.new_std
            clipped = min(1.0, max(-1.0, cos))
            score = clipped if fusion is None else key
            keyed.append((key, (item, float(np.arccos(clipped)), score, True)))
        keyed.sort(key=lambda pair: -pair[0])  # stable: the index's order among equal keys
        out.append(([hit for _, hit in keyed] + old_hits)[:k])
    return out


@pytest.mark.parametrize(("fused", "share"), [(False, 0.1), (True, 0.1), (True, 0.9)])
def test_batched_ranking_answers_the_rule_candidate_by_candidate(
    wordnet_small: dict, fused: bool, share: float
) -> None:
    """Real candidates (the cosine gallery's stage one at depth 60) and real new vectors (the
    MPNet rows of the same texts) for some of them: the batched ``ranking.ranked`` gives the
    hits the rule gives worked candidate by candidate, in the same order, with the same
    values."""
    index, points = _cosine_gallery(wordnet_small, "torch")
    new = _rows(wordnet_small, NEW)
    rng = np.random.default_rng(4)
    pick = rng.choice(len(points), 40, replace=False)
    found = index.search_candidates(points[pick], 60, cosines=True)
    ids = found.ids.copy()
    ids[3, 5:] = -1  # a padded query, with fewer candidates than k
    position = {int(v): p for p, v in enumerate(index.ids)}
    # A share of the gallery re-embedded (unit rows, as the in-memory copy keeps them); at a
    # tenth most queries have fewer than k candidates with a new vector, the rest come in the
    # index's order.
    have = rng.random(len(points)) < share
    have_ids = index.ids[have]
    rows = new[[position[int(v)] for v in have_ids]]
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    vectors = two_stage.NewVectors.of(have_ids, rows)
    features = new[pick] * rng.uniform(0.5, 2.0, (len(pick), 1))
    fusion = None
    if fused:
        fusion = two_stage.Fusion(0.3, FusionScale(0.4, 0.15, 0.3, 0.12))
    args = (ids, found.distances, found.cosines, features, vectors, 10)
    want = _ranked_one_by_one(*args, fusion)
    got = ranking.ranked(*args, fusion)
    assert [[h[0] for h in row] for row in got] == [[h[0] for h in row] for row in want]
    assert [[h[3] for h in row] for row in got] == [[h[3] for h in row] for row in want]
    # The same float32 products but for the last bit (a BLAS kernel's rounding is not a plain
    # dot product's). Distances compared through their cosine: arccos near 1 turns one float32
    # ulp of a query's own item (cosine ~1) into 3e-4 rad.
    for g_row, w_row in zip(got, want, strict=True):
        np.testing.assert_allclose(
            [(np.cos(h[1]), h[2]) for h in g_row] or np.empty((0, 2)),
            [(np.cos(h[1]), h[2]) for h in w_row] or np.empty((0, 2)),
            rtol=1e-6,
            atol=1e-6,
        )
    assert any(h[3] for row in got for h in row)
    if share < 0.5:
        assert any(not h[3] for row in got for h in row)  # hits in the old index's order
    assert ranking.ranked(ids[:0], *[a[:0] for a in args[1:4]], vectors, 10) == []
    # Nothing re-embedded yet: every hit in the index's order, as before.
    none = two_stage.NewVectors.of(np.empty(0, np.int64), np.empty((0, new.shape[1]), np.float32))
    assert ranking.ranked(*args[:4], none, 10, fusion) == _ranked_one_by_one(
        *args[:4], none, 10, fusion
    )
