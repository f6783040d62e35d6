"""Mixed search of a partially backfilled gallery: two lists, one merge.

The native list scores the re-embedded items by the new backbone's features, the other list the
rest by the bridged queries (or, in a transition search, the old model's own). Both are
calibrated against the model's reference sample and merged in one order by
``app.ml.backfill.mixed.merge`` (why it is built as it is: that module's docstring). The lists
are searched in the service's store, or where an attached collection keeps the re-embedded
vectors (``SearchLists``, ``app.migration.in_place``); the merge here is the same for both.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sqlalchemy.orm import Session

from app.galleries.models import Gallery
from app.galleries.service import index_for
from app.migration.membership import lifts_of
from app.migration.reembed import (
    FIT_CACHE_SIZE,
    backfill_fit,
    reembedded_count,
    reembedded_features,
)
from app.ml.backfill.mixed import Candidates, lorentz_time, merge, top_cosines, unit_rows
from app.ml.upgrade.fit_view import bridged_reference_fit, native_reference_fit
from app.models.models import TrainedModel
from app.models.service import ModelCache
from app.vectors.faiss.index_store import IndexStore
from app.vectors.lorentz_rows import best_by_id
from app.vectors.points import lift_of


@dataclass(frozen=True)
class PreparedReference:
    """A model's reference documents as every search of one gallery scores them: the new
    features as unit rows, the old vectors lifted into the gallery's frame (float32) with their
    Lorentz time components. Computed once per (gallery, model), not per search: neither the
    fit nor a gallery's lift ever changes."""

    new_unit: np.ndarray
    points: np.ndarray
    points_time: np.ndarray


_references: OrderedDict[tuple[str, str], PreparedReference] = OrderedDict()
_references_lock = threading.Lock()


def _prepared_reference(
    gallery: Gallery, model_id: str, ref_new: np.ndarray, ref_old: np.ndarray
) -> PreparedReference:
    key = (gallery.id, model_id)
    with _references_lock:
        cached = _references.get(key)
        if cached is not None:
            _references.move_to_end(key)
            return cached
    lifted = lift_of(gallery)(torch.as_tensor(ref_old, dtype=torch.float64)).numpy()
    points = np.ascontiguousarray(lifted, dtype=np.float32)
    prepared = PreparedReference(
        unit_rows(ref_new), points, lorentz_time(points, gallery.lift_curv)
    )
    with _references_lock:
        _references[key] = prepared
        while len(_references) > FIT_CACHE_SIZE:
            _references.popitem(last=False)
    return prepared


def _without_reembedded(
    index: Any,
    query_points: np.ndarray,
    reembedded: np.ndarray,
    k: int,
    overfetch: int,
    min_candidates: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest items per query that are not re-embedded (ids −1 / distances inf padded):
    fetched with room for the re-embedded share, and only the queries still short of k fetched
    again with four times the room (a batch is not searched again for one unlucky query).
    An index that can skip them in its scan does (``can_exclude``): one pass over fewer rows."""
    if getattr(index, "can_exclude", False):
        ids, dist, _ = index.search_with_points(
            query_points, k, overfetch=overfetch, min_candidates=min_candidates, exclude=reembedded
        )
        return ids, dist
    total = int(index.ntotal)
    nq = len(query_points)
    need = min(k, max(total - len(reembedded), 0))
    share = len(reembedded) / total if total else 0.0
    want = min(total, max(2 * k, int(np.ceil(1.5 * k / max(1.0 - share, 0.05)))))
    out_ids = np.full((nq, k), -1, dtype=np.int64)
    out_dist = np.full((nq, k), np.inf)
    todo = np.arange(nq)
    while todo.size and want > 0:
        ids, dist, _ = index.search_with_points(
            query_points[todo], want, overfetch=overfetch, min_candidates=min_candidates
        )
        keep = ~(np.isin(ids, reembedded) | (ids < 0))
        # The first k kept per row, in order (stable sort puts kept entries first).
        order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
        got_ids = np.take_along_axis(np.where(keep, ids, -1), order, axis=1)
        got_dist = np.take_along_axis(np.where(keep, dist, np.inf), order, axis=1)
        width = got_ids.shape[1]
        out_ids[todo, :width], out_dist[todo, :width] = got_ids, got_dist
        short = keep.sum(axis=1) < need
        if want >= total or not short.any():
            break
        todo, want = todo[short], min(total, want * 4)
    return out_ids, out_dist


# Candidates past the k-th taken from the scan of re-embedded features, so that a tie across the
# k-th place (duplicate documents) is ordered by id whole, as an attached collection's is.
TIE_ROOM = 16


# (native, other): the native list's (vector ids, cosines against the new features) and the
# other list's (vector ids, Lorentz distances to the query points), each nq × k, −1 padded.
Lists = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
# Where a gallery's two lists are searched when not in the service's own store (an attached
# collection, ``app.migration.in_place.search_lists``): (session, gallery, model, features,
# query points, k) → the lists, or None when no item is re-embedded for the model.
SearchLists = Callable[[Session, Gallery, TrainedModel, np.ndarray, np.ndarray, int], Lists | None]


def hit_distances(
    merged_ids: np.ndarray,
    from_native: np.ndarray,
    native: tuple[np.ndarray, np.ndarray],
    bridged: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """Each merged hit's distance from the list it came from (nq × k float64; inf for pads): the
    value beside its id in that list (ids, values; nq × k' each, an id at most once per row)."""
    out = np.full(merged_ids.shape, np.inf)
    for (ids, values), mine in ((native, from_native), (bridged, ~from_native)):
        if ids.shape[1] == 0:
            continue
        same = ids[:, :, None] == merged_ids[:, None, :]  # nq × k' × k
        at = np.take_along_axis(np.asarray(values), same.argmax(axis=1), axis=1)
        out = np.where(mine & same.any(axis=1) & (merged_ids >= 0), at, out)
    return out


def mixed_search(
    session: Session,
    store: IndexStore,
    cache: ModelCache,
    gallery: Gallery,
    row: TrainedModel,
    features: np.ndarray,
    query_points: np.ndarray,
    k: int,
    *,
    overfetch: int,
    min_candidates: int,
    transition: bool = False,
    lists: SearchLists | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Top-k over the mixed gallery, or None when no item is re-embedded for ``row``.
    ``query_points``: the bridged queries, or with ``transition`` the old model's own query
    vectors (lifted); each list is merged with its own relevance map where the fit has one.
    ``lists``: where the two lists are searched, when not in the service's store; the merge is
    this one whatever searched them.

    Returns (vector ids, merge keys, distances, from_native), each nq × k (−1 padded).
    Distances: the Lorentz distance of bridged hits; the angle (radians) between the query's
    and the item's new features for re-embedded hits."""
    if lists is not None:
        found = lists(session, gallery, row, features, query_points, k)
        if found is None:
            return None
        reembedded = reembedded_count(session, gallery.id, row.id)
    else:
        vector_ids, new_features = reembedded_features(session, gallery.id, row.id)
        if len(vector_ids) == 0:
            return None
        # Native list: an exact scan of the re-embedded items. Bridged (or old) list: the
        # gallery's index, re-embedded items dropped.
        pos, nscores = top_cosines(unit_rows(features), new_features, k + TIE_ROOM)
        native = best_by_id(vector_ids[pos], nscores, k)
        index = index_for(session, store, gallery)
        other = _without_reembedded(
            index, query_points, np.sort(vector_ids), k, overfetch, min_candidates
        )
        found = (native, other)
        reembedded = len(vector_ids)
    (native_ids, nscores), (ids, dist) = found
    fit, ref_new, ref_old = backfill_fit(session, cache, row)
    curv = gallery.lift_curv
    ref = _prepared_reference(gallery, row.id, ref_new, ref_old)
    native_fit = native_reference_fit(features, ref.new_unit, unit_reference=True)
    bridged_fit = bridged_reference_fit(query_points, ref.points, curv, ref.points_time)
    bridged_scores = np.where(ids < 0, -np.inf, -np.cosh(np.sqrt(curv) * dist) / curv)
    merged_ids, calibrated, from_native = merge(
        Candidates(native_ids, nscores, native_fit),
        Candidates(ids, bridged_scores, bridged_fit),
        k,
        fit.maps("old" if transition else "bridged"),
        # What the click log says of the re-embedded set (app.ml.backfill.membership): (1, 1)
        # without a log or when the set is as likely as any to hold what users look for.
        lifts_of(session, gallery, row.id, reembedded),
    )
    # Each hit's distance from the list it came from: the angle of a native hit's cosine, the
    # Lorentz distance of a bridged one.
    angles = np.arccos(np.clip(nscores, -1.0, 1.0))
    distances = hit_distances(merged_ids, from_native, (native_ids, angles), (ids, dist))
    return merged_ids, calibrated, distances, from_native
