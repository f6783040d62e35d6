"""Held-out queries against the whole gallery when only its paired items have new features
(issue 44 item 2). Pure: arrays in, arrays out.

A user's gallery holds items the upgrade's dataset does not pair: the dataset has no new
features for them, so no search of the held-out data can score them natively. They are still
in the gallery, and every search a user runs meets them: an upgrade's held-out figures score
them as distractors in the old space. Where a figure re-embeds items (a reindex, the transition
curve), the paired items take the new space and the unpaired ones stay in the old space, and the
two are merged exactly as the service's transition search merges them
(``app.ml.backfill.mixed``: each list calibrated against the tail of a fixed reference sample of
the paired items, ``calibrated_pair``; with ``CALIBRATION`` "relevance" each list's
P̂(relevant | c), cross-fitted here — each half of the queries keyed with maps fitted on the other
half, so no query grades its own map; ``mixed`` picks per item).

The work is done a block of queries at a time (``KeyBlock``), so memory is bounded by the block,
not by queries × gallery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from app.ml.backfill.mixed import (
    CALIBRATION,
    COSINE_END,
    NO_MAPS,
    SCORE_BUDGET,
    Maps,
    calibrated_pair,
    calibrated_scores,
    cosine_scores,
    lorentz_end,
    lorentz_scores,
    lorentz_time,
    mixed,
    pick_reference,
    reference_fit,
    unit_rows,
)
from app.ml.backfill.relevance import CANDIDATES, RelevanceMap, fit_relevance


@dataclass(frozen=True)
class KeyBlock:
    """One block of queries: ``rows`` (positions in the caller's query arrays), the merge keys of
    the G paired items scored natively (len(rows) × G), the merge keys of every searched item in
    the old space (len(rows) × N, the G paired items first) and the raw old-space scores those
    keys order (Lorentz inner products, larger nearer)."""

    rows: np.ndarray
    native: np.ndarray
    old: np.ndarray
    old_scores: np.ndarray

    def mixed(self, reembedded: np.ndarray) -> np.ndarray:
        """Every searched item's key with the paired items where ``reembedded`` (G bools) in the
        new space and the others — the unpaired items always — in the old one."""
        g = self.native.shape[1]
        head = mixed(self.native, self.old[:, :g], reembedded)
        if self.old.shape[1] == g:
            return head
        return np.concatenate([head, self.old[:, g:]], axis=1)


def _block_size(n: int) -> int:
    """Queries per block: two key matrices (float64 with maps) and the scores behind them stay
    within ``SCORE_BUDGET`` bytes-ish (256 MiB) at any gallery size."""
    return max(1, SCORE_BUDGET // 8 // max(n, 1))


Scorer = Callable[[np.ndarray], np.ndarray]


def _fit_maps(
    score: tuple[Scorer, Scorer],
    fits: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]],
    rows: np.ndarray,
    relevant: Sequence[np.ndarray],
    block: int,
) -> Maps:
    """Both lists' P̂(relevant | c) fitted on the queries ``rows``: ``fit_relevance`` on each
    query's ``CANDIDATES`` best calibrated scores (the only ones it reads), gathered a block at a
    time so the full matrix never exists."""
    maps: list[RelevanceMap | None] = []
    for side in range(2):
        tops: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        for start in range(0, len(rows), block):
            part = rows[start : start + block]
            scores = score[side](part)
            c = calibrated_scores(scores, tuple(a[part] for a in fits[side]))
            k = min(CANDIDATES, c.shape[1])
            top = np.argpartition(-c, k - 1, axis=1)[:, :k]
            tops.append(np.take_along_axis(c, top, axis=1))
            labels.extend(
                np.flatnonzero(np.isin(t, relevant[q])) for t, q in zip(top, part, strict=True)
            )
        maps.append(fit_relevance(np.concatenate(tops), labels) if tops else None)
    return maps[0], maps[1]


def key_blocks(
    native_queries: np.ndarray,
    items_new: np.ndarray,
    old_queries: np.ndarray,
    items_old: np.ndarray,
    curv: float,
    relevant: Sequence[np.ndarray],
    seed: int = 0,
    calibration: str = CALIBRATION,
) -> Iterator[KeyBlock]:
    """The merge keys of held-out queries over a gallery whose first G items (``items_new``:
    their new features) can be re-embedded and whose N items (``items_old``: old points in the
    gallery's Lorentz frame, the G first) are all in the old space.

    ``native_queries``: the queries' new-backbone features (Q × D); ``old_queries``: the old-space
    list's query points (Q × d: the old model's lifted query vectors for a transition search,
    the bridged query for a mixed one); ``relevant``: per query its relevant positions (< G).
    The reference sample is the paired items' (the fit's, ``pick_reference(G, seed)``); the
    halves the relevance maps are cross-fitted on are drawn from ``[seed, 31]``. Blocks come
    grouped by half."""
    g, n = len(items_new), len(items_old)
    if n < g:
        raise ValueError("the old points must include the paired items first")
    new_unit = unit_rows(items_new)
    old32 = np.ascontiguousarray(items_old, dtype=np.float32)
    old_time = lorentz_time(old32, curv)
    reference = pick_reference(g, seed)
    fits = (
        reference_fit(
            cosine_scores(native_queries, new_unit[reference], unit_items=True), end=COSINE_END
        ),
        reference_fit(
            lorentz_scores(old_queries, old32[reference], curv, old_time[reference]),
            end=lorentz_end(curv),
        ),
    )

    def native(part: np.ndarray) -> np.ndarray:
        return cosine_scores(native_queries[part], new_unit, unit_items=True)

    def old(part: np.ndarray) -> np.ndarray:
        return lorentz_scores(old_queries[part], old32, curv, old_time)

    block = _block_size(n)
    q = len(relevant)
    if calibration == "relevance" and q >= 2:
        perm = np.random.default_rng([seed, 31]).permutation(q)
        halves = [np.sort(h) for h in np.array_split(perm, 2)]
        groups = [
            (halves[i], _fit_maps((native, old), fits, halves[1 - i], relevant, block))
            for i in (0, 1)
        ]
    else:
        groups = [(np.arange(q), NO_MAPS)]
    for rows, maps in groups:
        for start in range(0, len(rows), block):
            part = rows[start : start + block]
            scores = old(part)
            part_fits = tuple(tuple(a[part] for a in fit) for fit in fits)
            keys = calibrated_pair(native(part), scores, part_fits, maps)  # type: ignore[arg-type]
            yield KeyBlock(part, keys[0], keys[1], scores)


def top_of_keys(keys: np.ndarray, k: int) -> np.ndarray:
    """Positions of each row's ``k`` largest keys, best first; among equal keys the lower
    position first (the service's tie rule)."""
    k = min(k, keys.shape[1])
    if k == 0:
        return np.zeros((keys.shape[0], 0), dtype=np.int64)
    part = np.argpartition(-keys, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(keys, part, axis=1)
    order = np.lexsort((part, -values), axis=1)
    return np.take_along_axis(part, order, axis=1)


def describe(
    paired: int,
    distractors: int,
    unpaired_total: int | None,
    old_list: str | None,
    evaluated_items: int,
) -> dict[str, object]:
    """What each held-out figure of an upgrade searched (the report's ``searched``).
    ``old_list``: what scored the unpaired items in the reindex's old-space list ("old model",
    "bridge"), None without query figures."""
    unpaired = distractors if unpaired_total is None else unpaired_total
    whole = paired + distractors
    sampled = distractors < unpaired
    if distractors:
        gallery = (
            f"{paired} paired items and {distractors} unpaired ones (the gallery's items "
            "without new features in the dataset"
            + (f"; a seeded sample of its {unpaired}" if sampled else "")
            + ")"
        )
    else:
        gallery = (
            f"the {paired} paired items: no unpaired item was given (the dataset pairs the "
            "whole gallery, or the caller passed no gallery)"
        )
    if old_list == "old model":
        rest = "by the old model's query vectors, merged as a transition search merges them"
    else:
        rest = "by the bridged query, merged as a mixed search merges them"
    out: dict[str, object] = {
        "paired_items": paired,
        "unpaired_items": unpaired,
        "distractors": distractors,
        "sampled": sampled,
        "query": {
            "items": whole,
            "gallery": gallery,
            "stay": f"the old model's query vectors against all {whole} old vectors",
            "bridge": f"the bridged query against all {whole} old vectors",
            "reindex": (
                f"the {paired} paired items re-embedded (the new backbone's cosine) and the "
                f"{distractors} unpaired ones in the old space, {rest}: the dataset has no new "
                "features for them, so a reindex of the whole gallery cannot be measured"
                if distractors
                else f"the {paired} paired items re-embedded (the new backbone's cosine)"
            ),
        },
        "transition": {
            "items": whole,
            "note": (
                f"a random share of the {paired} paired items re-embedded (the curve's "
                f"fraction is that share), the {distractors} unpaired items in the old space at "
                "every share: 100 % is the reindex figure above"
                if distractors
                else f"a random share of the {paired} paired items re-embedded"
            ),
        },
        "two_stage": {
            "items": paired,
            "note": f"candidates among the {paired} paired items only: stage two ranks them by "
            "their new features, which the unpaired items lack",
        },
        "instance": {
            "items": paired,
            "note": f"each held-out item's own new features against the {paired} paired items",
        },
        "class": {
            "items": evaluated_items,
            "note": f"the {evaluated_items} held-out items against each other",
        },
    }
    return out
