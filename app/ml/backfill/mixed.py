"""Mixed search of a partly re-embedded gallery: re-embedded items scored natively, the rest by
the bridged query, both merged on one calibrated scale. Pure: arrays in, arrays out. (Which items
to re-embed first is ``app.ml.backfill.plan``.)

**One gallery, two lists, one scale.** A re-embedded item is scored *natively* — the cosine of
the new backbone's query features and the item's new features, exactly what a full reindex
computes — and every other item by the bridged query against its old vector (the gallery's own
score). Each list is ranked in its own space; what merges them is an estimate of the same
quantity for both: the share of the gallery that would score above the item if every item were
scored the way this one is. Per query and per list, the upper tail of the scores above the
(m+1)-th best is modelled as exponential (peaks-over-threshold with the mean excess as scale):

    P̂(S > s) = (m / n) · exp(−(s − u) / σ),   u = the (m+1)-th best score, σ = mean(top m − u)

and the calibrated score is c = −ln P̂ (larger is nearer). Both lists' scores have a known
upper end e (a cosine ≤ 1; a Lorentz inner product ≤ −1/curv, reached at the query's own point),
and near it the tail is not exponential: the share of items within distance δ of the end falls
like a power of δ (δ^((d−1)/2) for cosines in d dimensions), so an exponential gives the end
itself a finite, modest c — in 6 dimensions an item re-embedded with the query's own features
ranked below bridged items. So the fit is made on t = −ln(e − s), where a power law is
exponential: P̂(S > s) = (m/n) · ((e − s)/(e − u))^α, the Hill estimator for 1/α, and c → ∞ at
the end (bounded by the float tolerance, ``EXACT_TOLERANCE``). Far from the end (high-d
embeddings, where the best cosines are far below 1) t is nearly affine in s and the fit is
the plain exponential one. Why this and not a fitted mapping:

- it is *per query*: the two spaces' score ranges differ by query (a short lemma has flat cosines
  everywhere, a specific one a sharp peak), which one global map fitted at upgrade time cannot
  follow; on the public lemma→gloss task a per-query z-score merged 5–10 % of the gallery at
  *below* the bridge's own R@10 and ~0.02 below the linear interpolation at 25–50 %, the tail
  estimate lands on the interpolation (see bench.quality.backfill);
- within a list c is increasing in the score, so at 100 % re-embedded the order *is* the native
  order: a full reindex exactly (and at 0 % exactly the bridge), whatever the calibration's error;
- it needs nothing stored with the model and no held-out data at search time.

A re-embedded item is scored by its native calibrated score alone (``MERGE_RULE``). The
alternatives — also letting its bridged score vouch for it (the max of the two), or averaging the
two estimates of the same −ln share — were compared on a validation carve of the training synsets
(``python -m bench.quality.backfill --validation --merge native,max,mean``): none was better by more than
the benchmark's resolution, and only ``native`` keeps 100 % exactly a reindex and needs no
bridged score for re-embedded items (BENCHMARKS.md, bench.quality.backfill).

Both lists' tails are fitted per query on the same reference documents (a seeded sample of the
upgrade's paired items, both sides: ``REFERENCE_SIZE``), so both estimate a share of one
population; re-embedded items are dropped from the bridged list, since their native score
replaces it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from app.ml.backfill.membership import NO_LIFTS, lifted_keys
from app.ml.backfill.relevance import RelevanceMap, merge_key

# Tail size m of the per-query exponential fit, fixed a priori: about the top 5 % of the
# ``REFERENCE_SIZE`` reference documents, the usual share for a peaks-over-threshold fit (enough
# points for the mean excess, few enough to stay in the tail); the estimate needs ≥ 2 items.
# Comparisons of 20, 50 and 100 were once made on evaluation figures; they are no part of the
# reason. The reason is a share, so a reference smaller than ``REFERENCE_SIZE`` (an upgrade with
# fewer paired items) fits the same share of it (``tail_size``: 23 of 480, not 100, which was 21 %).
TAIL_SIZE = 100
# Reference documents (a seeded sample of the upgrade's paired items, both sides) on which each
# query's two tails are fitted: one population for both lists, so their estimates agree.
REFERENCE_SIZE = 2048
# Scores within this share of (1 + |e|) of their list's upper end e are exact matches (float32
# rounding of a cosine of equal vectors, of a Lorentz product of equal points): they tie at the top.
EXACT_TOLERANCE = 1e-6
COSINE_END = 1.0
# Queries × items scored at once by a ranking pass (bounds the float32 working set, 256 MiB).
SCORE_BUDGET = 2**26
# How a re-embedded item is scored in a mixed gallery: its native calibrated score alone, or
# combined with its bridged one (max: either list may vouch for it; mean: two estimates of the
# same −ln share averaged). bench.quality.backfill --validation compares them on training data.
MERGE_RULES = ("native", "max", "mean")
MERGE_RULE = "native"
# What two lists are merged on: the reference-tail calibration c alone, or each list's
# P̂(relevant | c) fitted on the upgrade's held-out queries where it has them
# (``app.ml.backfill.relevance``). Chosen on validation (bench.quality.transition --validation).
CALIBRATIONS = ("tail", "relevance")
CALIBRATION = "relevance"


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def products(queries: np.ndarray, items: np.ndarray) -> np.ndarray:
    """queries @ items.T for float32 rows, by torch: the searches' scans are torch products, and
    a NumPy (OpenBLAS) product between them leaves its threads spinning for a while after it,
    on the cores the next torch product needs (a third slower on a 2-core machine)."""
    q, x = (a if a.flags.writeable else a.copy() for a in (queries, items))
    return (torch.from_numpy(q) @ torch.from_numpy(x).T).numpy()


def lorentz_time(points: np.ndarray, curv: float) -> np.ndarray:
    """x₀ = √(1/c + ‖x‖²) of points given by their space part x (float64)."""
    x = np.asarray(points, dtype=np.float64)
    return np.sqrt(1.0 / curv + np.einsum("ij,ij->i", x, x))


def lorentz_scores(
    queries: np.ndarray,
    points: np.ndarray,
    curv: float,
    points_time: np.ndarray | None = None,
) -> np.ndarray:
    """⟨q, x⟩_L = q·x − q₀x₀ (nq × n float32; larger is nearer), in blocks of queries.
    ``points_time``: the points' ``lorentz_time``, when the caller keeps it (a fixed reference
    sample scored for every query)."""
    q = np.asarray(queries, dtype=np.float32)
    x = np.asarray(points, dtype=np.float32)
    # From the float32 rows, as the product below sees them.
    q0 = lorentz_time(q, curv)
    x0 = lorentz_time(x, curv) if points_time is None else points_time
    out = np.empty((len(q), len(x)), dtype=np.float32)
    block = max(1, SCORE_BUDGET // max(len(x), 1))
    for start in range(0, len(q), block):
        part = slice(start, start + block)
        out[part] = products(q[part], x) - np.outer(q0[part], x0).astype(np.float32)
    return out


def cosine_scores(
    queries: np.ndarray, items: np.ndarray, *, unit_items: bool = False
) -> np.ndarray:
    """cos(q, x) (nq × n float32). ``unit_items``: the items are already ``unit_rows`` (a fixed
    reference sample normalised once, not for every query)."""
    q = unit_rows(queries)
    x = np.asarray(items, dtype=np.float32) if unit_items else unit_rows(items)
    out = np.empty((len(q), len(x)), dtype=np.float32)
    block = max(1, SCORE_BUDGET // max(len(x), 1))
    for start in range(0, len(q), block):
        out[start : start + block] = products(q[start : start + block], x)
    return out


# -- the calibrated merge ---------------------------------------------------------------------


def lorentz_end(curv: float) -> float:
    """The largest Lorentz inner product ⟨q, x⟩_L of two points of curvature −curv (q = x)."""
    return -1.0 / curv


def tail_scale(scores: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The score on which the tail is exponential: −ln(e − s) where the end e is known (finite),
    s itself where it is not (NaN)."""
    s = np.asarray(scores, dtype=np.float64)
    e = np.asarray(end, dtype=np.float64)[:, None]
    bounded = np.isfinite(e)
    e0 = np.where(bounded, e, 0.0)
    gap = np.maximum(e0 - s, EXACT_TOLERANCE * (1.0 + np.abs(e0)))
    with np.errstate(invalid="ignore"):
        return np.where(bounded, np.where(np.isfinite(s), -np.log(gap), s), s)


def tail_fit(
    top_scores: np.ndarray, population: int, m: int = TAIL_SIZE, end: float | None = None
) -> tuple[np.ndarray, ...]:
    """Per row of ``top_scores`` (nq × ≥1, best first, NaN/−inf padded): (u, σ, ln(m/n), e) of
    the exponential tail above the (m+1)-th best of a list of ``population`` items, on
    ``tail_scale`` of the scores (``end``: the scores' upper end, None when unbounded)."""
    top = np.asarray(top_scores, dtype=np.float64)
    nq = top.shape[0]
    ends = np.full(nq, np.nan if end is None else float(end))
    top = tail_scale(top, ends)
    avail = np.isfinite(top).sum(axis=1) if top.size else np.zeros(nq, dtype=np.int64)
    m_eff = np.clip(np.minimum(avail - 1, min(m, max(population - 1, 0))), 0, None)
    rows = np.arange(nq)
    safe = np.where(np.isfinite(top), top, 0.0)
    u = np.where(avail > 0, safe[rows, np.minimum(m_eff, np.maximum(avail - 1, 0))], 0.0)
    cols = np.arange(top.shape[1])[None, :]
    in_tail = cols < m_eff[:, None]
    excess = np.where(in_tail, safe - u[:, None], 0.0).sum(axis=1)
    sigma = np.where(m_eff > 0, excess / np.maximum(m_eff, 1), 0.0)
    # A flat tail (ties) or one item: a tiny scale keeps the order and puts ties together.
    sigma = np.maximum(sigma, 1e-6)
    # With no tail the best item alone is known: half a rank of n.
    share = np.where(m_eff > 0, m_eff / max(population, 1), 0.5 / max(population, 1))
    return u, sigma, np.log(share), ends


def calibrate(scores: np.ndarray, fit: tuple[np.ndarray, ...]) -> np.ndarray:
    """c = −ln P̂(S > s) for scores (nq × k) of one list (larger is nearer)."""
    u, sigma, log_share, ends = fit
    t = tail_scale(scores, ends)
    return -(log_share[:, None] - (t - u[:, None]) / sigma[:, None])


def calibrated_scores(scores: np.ndarray, fit: tuple[np.ndarray, ...]) -> np.ndarray:
    """``calibrate`` of a full score matrix (nq × n float32), in blocks of queries."""
    out = np.empty(scores.shape, dtype=np.float32)
    block = max(1, SCORE_BUDGET // 4 // max(scores.shape[1], 1))
    for start in range(0, scores.shape[0], block):
        part = slice(start, start + block)
        out[part] = calibrate(scores[part], tuple(a[part] for a in fit))
    return out


@dataclass(frozen=True)
class Candidates:
    """One list's best items per query (nq × k', best first; id −1 / score −inf pads) and the
    tail fitted on its reference scores."""

    ids: np.ndarray
    scores: np.ndarray
    fit: tuple[np.ndarray, ...]


def pick_reference(n: int, seed: int = 0, size: int = REFERENCE_SIZE) -> np.ndarray:
    """Sorted rows of the reference sample among ``n`` paired items."""
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, 1212]).choice(n, size, replace=False))


def tail_size(reference: int, m: int = TAIL_SIZE) -> int:
    """The tail fitted over ``reference`` documents: m for a full reference (``REFERENCE_SIZE``
    or more), the same share m/REFERENCE_SIZE of a smaller one, rounded, at least 2 (the mean
    excess needs two points)."""
    if reference >= REFERENCE_SIZE:
        return m
    return max(2, round(m * reference / REFERENCE_SIZE))


def reference_fit(
    reference_scores: np.ndarray, m: int = TAIL_SIZE, end: float | None = None
) -> tuple[np.ndarray, ...]:
    """The tail of each query's scores over the reference documents (nq × r), ``tail_size(r,
    m)`` of them; ``end``: the scores' upper end (None: unbounded)."""
    m = tail_size(np.asarray(reference_scores).shape[1], m)
    _, top = top_of(np.asarray(reference_scores), m + 1)
    return tail_fit(top, reference_scores.shape[1], m, end)


Maps = tuple[RelevanceMap | None, RelevanceMap | None]
NO_MAPS: Maps = (None, None)


def paired(maps: Maps) -> Maps:
    """Both lists' relevance maps, or neither: P̂ (in [0, 1]) on one list against the
    calibration c (a good hit several units) on the other orders by scale, not by evidence; with
    one map missing (too few held-out positives in that space) both merge on c."""
    return maps if all(m is not None for m in maps) else NO_MAPS


def merge(
    native: Candidates,
    other: Candidates,
    k: int,
    maps: Maps = NO_MAPS,
    lifts: tuple[float, float] = NO_LIFTS,
):
    """Merged top-k per query: (ids, merge keys, from_native) arrays nq × k (pads: id −1).
    ``other`` (the bridged list, or the old model's own in a transition search) must already
    exclude re-embedded items; ``maps``: each list's relevance map (``app.ml.backfill.relevance``;
    None: its calibrated score is the key; one alone is not used, ``paired``); ``lifts``: the
    membership evidence of each list (``app.ml.backfill.membership``; (1, 1): none)."""
    maps = paired(maps)
    probability = maps[0] is not None
    parts = []
    for cand, is_native, relevance, lift in (
        (native, True, maps[0], lifts[0]),
        (other, False, maps[1], lifts[1]),
    ):
        if cand.ids.size == 0:
            continue
        key = lifted_keys(merge_key(calibrate(cand.scores, cand.fit), relevance), lift, probability)
        c = np.where(cand.ids >= 0, key, -np.inf)
        parts.append((cand.ids, c, np.full(cand.ids.shape, is_native)))
    nq = max(native.ids.shape[0], other.ids.shape[0])
    if not parts:
        return (
            np.full((nq, k), -1, dtype=np.int64),
            np.full((nq, k), -np.inf),
            np.zeros((nq, k), dtype=bool),
        )
    ids = np.concatenate([p[0] for p in parts], axis=1)
    c = np.concatenate([p[1] for p in parts], axis=1)
    src = np.concatenate([p[2] for p in parts], axis=1)
    # Stable on ties: native first (it is the new model's own judgement).
    order = np.argsort(-c, axis=1, kind="stable")[:, :k]
    ids, c, src = (np.take_along_axis(a, order, axis=1) for a in (ids, c, src))
    if ids.shape[1] < k:
        pad = k - ids.shape[1]
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        c = np.pad(c, ((0, 0), (0, pad)), constant_values=-np.inf)
        src = np.pad(src, ((0, 0), (0, pad)), constant_values=False)
    return ids, c, src


def top_cosines(
    queries_unit: np.ndarray, items_unit: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(positions, cosines) of the k most similar items per query, best first, for unit rows
    (float32): torch's product and top-k (a partial sort in C, several times faster than
    argpartition on a 256 × 25,000 block), in blocks of queries within ``SCORE_BUDGET``."""
    nq, n = len(queries_unit), len(items_unit)
    k = min(k, n)
    positions = np.zeros((nq, k), dtype=np.int64)
    values = np.zeros((nq, k), dtype=np.float32)
    if k == 0 or nq == 0:
        return positions, values
    items = torch.from_numpy(np.ascontiguousarray(items_unit, dtype=np.float32))
    queries = torch.from_numpy(np.ascontiguousarray(queries_unit, dtype=np.float32))
    block = max(1, SCORE_BUDGET // max(n, 1))
    for start in range(0, nq, block):
        top = torch.topk(queries[start : start + block] @ items.T, k, dim=1, sorted=True)
        positions[start : start + block] = top.indices.numpy()
        values[start : start + block] = top.values.numpy()
    return positions, values


def top_of(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, scores) of the k best per row, best first."""
    k = min(k, scores.shape[1])
    if k == 0:
        return np.zeros((scores.shape[0], 0), dtype=np.int64), np.zeros((scores.shape[0], 0))
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)


def calibrated_pair(
    native: np.ndarray,
    bridged: np.ndarray,
    fits: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]],
    maps: Maps = NO_MAPS,
) -> tuple[np.ndarray, np.ndarray]:
    """Both lists' merge keys (nq × n, ``merge_key`` of the calibrated scores) for full score
    matrices: every item as if re-embedded, and every item scored by the other list. A mixed
    gallery picks per item (``mixed``). float32 without maps; float64 with them (a key's tie
    term is below float32's resolution at P̂ ≈ 1). One map alone is not used (``paired``)."""
    maps = paired(maps)
    dtype = np.float32 if all(m is None for m in maps) else np.float64
    out = (np.empty(native.shape, dtype), np.empty(bridged.shape, dtype))
    chunk = max(1, SCORE_BUDGET // 4 // max(native.shape[1], 1))
    for start in range(0, native.shape[0], chunk):
        part = slice(start, start + chunk)
        for scores, fit, dest in ((native, fits[0], out[0]), (bridged, fits[1], out[1])):
            dest[part] = calibrate(scores[part], tuple(a[part] for a in fit))
    for dest, relevance in zip(out, maps, strict=True):
        if relevance is not None:
            for start in range(0, dest.shape[0], chunk):
                dest[start : start + chunk] = merge_key(dest[start : start + chunk], relevance)
    return out


def mixed(
    cal_native: np.ndarray,
    cal_bridged: np.ndarray,
    reembedded: np.ndarray,
    rule: str = MERGE_RULE,
    lifts: tuple[float, float] = NO_LIFTS,
    probability: bool = False,
) -> np.ndarray:
    """The calibrated score of every item in a gallery re-embedded where ``reembedded``: the
    bridged one for the others, and for re-embedded items per ``rule`` (``MERGE_RULES``).
    ``lifts``: each list's membership evidence (``app.ml.backfill.membership``), applied to
    keys that are P̂ (``probability``: ``calibrated_pair`` with maps) or calibrated scores."""
    if rule == "native":
        own = cal_native
    elif rule == "max":
        own = np.maximum(cal_native, cal_bridged)
    elif rule == "mean":
        own = (cal_native + cal_bridged) / 2
    else:
        raise ValueError(f"unknown merge rule {rule!r}, expected one of {list(MERGE_RULES)}")
    if lifts != NO_LIFTS:
        own = lifted_keys(own, lifts[0], probability)
        cal_bridged = lifted_keys(cal_bridged, lifts[1], probability)
    return np.where(np.asarray(reembedded, dtype=bool)[None, :], own, cal_bridged)


def ranks_of(scores: np.ndarray, relevant: Sequence[np.ndarray]) -> np.ndarray:
    """The 0-based rank of each row's best relevant item (ties count in its favour)."""
    if all(len(rel) == 1 for rel in relevant):
        rows = np.arange(len(relevant))
        best = scores[rows, np.array([rel[0] for rel in relevant], dtype=np.int64)]
        return (scores > best[:, None]).sum(axis=1).astype(np.int64)
    return np.array(
        [int((scores[q] > scores[q, rel].max()).sum()) for q, rel in enumerate(relevant)],
        dtype=np.int64,
    )


def merged_ranks(
    native: np.ndarray,
    bridged: np.ndarray,
    reembedded: np.ndarray,
    relevant: Sequence[np.ndarray],
    fits: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]],
    rule: str = MERGE_RULE,
    maps: Maps = NO_MAPS,
) -> np.ndarray:
    """For full score matrices (nq × n: native cosines, bridged scores), a re-embedded mask and
    the two lists' reference tails (``reference_fit``), the merged 0-based rank of each query's
    best relevant item: what a mixed search returns."""
    mask = np.asarray(reembedded, dtype=bool)
    ranks = np.empty(len(relevant), dtype=np.int64)
    chunk = max(1, SCORE_BUDGET // 4 // max(native.shape[1], 1))
    for start in range(0, len(relevant), chunk):
        part = slice(start, start + chunk)
        fit_part = tuple(tuple(a[part] for a in fit) for fit in fits)
        cal = calibrated_pair(native[part], bridged[part], fit_part, maps)  # type: ignore[arg-type]
        ranks[part] = ranks_of(mixed(*cal, mask, rule), relevant[part])
    return ranks
