"""The traffic signals of a gallery, read for the backfill plan: its access counts, the service's
tally of what searches returned (``app.migration.returned``) and the neighbourhood of its most
clicked items (a search of the gallery's own index for each); the choice among their
combinations is pure (``app.ml.backfill.traffic_model``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.galleries.models import Gallery
from app.galleries.service import index_for
from app.migration import access
from app.migration.returned import weights_by_point
from app.ml.backfill.traffic_model import (
    NEIGHBOURS,
    Neighbourhood,
    TrafficChoice,
    choose_traffic,
    heavy_items,
    nearest_others,
)
from app.vectors.faiss.index_store import IndexStore


@dataclass(frozen=True)
class Signals:
    clicks: np.ndarray | None  # access count per point (None: the gallery has none)
    returned: np.ndarray | None  # returned weight per point (None: nothing tallied)
    hood: Neighbourhood | None


def clicked_neighbourhood(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    all_ids: np.ndarray,
    points: np.ndarray,
    clicks: np.ndarray,
) -> Neighbourhood:
    """The ``HEAVY_ITEMS`` most clicked items and their ``NEIGHBOURS`` nearest other items in
    the gallery's own space (one search of its index, exact for a flat one)."""
    sources = heavy_items(clicks)
    if not len(sources):
        return nearest_others(sources, np.empty((0, NEIGHBOURS + 1), dtype=np.int64))
    index = index_for(session, store, gallery)
    ids, _, _ = index.search_with_points(points[sources], NEIGHBOURS + 1)
    at = np.searchsorted(all_ids, ids)
    inside = np.minimum(at, max(len(all_ids) - 1, 0))
    known = (ids >= 0) & (at < len(all_ids)) & (all_ids[inside] == ids)
    return nearest_others(sources, np.where(known, inside, -1))


def read_signals(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    all_ids: np.ndarray,
    points: np.ndarray,
) -> Signals:
    clicks = access.counts_by_point(session, gallery.id, all_ids)
    returned = weights_by_point(session, gallery.id, all_ids)
    hood = None
    if clicks is not None:
        hood = clicked_neighbourhood(session, store, gallery, all_ids, points, clicks)
    return Signals(clicks, returned, hood)


def traffic_choice(
    signals: Signals, done: np.ndarray, count: int, tiebreak: np.ndarray
) -> TrafficChoice | None:
    """The validated traffic estimate, or None when the gallery has no access counts (the
    returned tally alone is never used: nothing to validate it against)."""
    if signals.clicks is None:
        return None
    return choose_traffic(
        signals.clicks.astype(np.int64), signals.returned, signals.hood, done, count, tiebreak
    )


def returned_summary(signals: Signals, choice: TrafficChoice | None) -> dict[str, Any] | None:
    """What the plan says of the returned tally: how much there is and whether it was used."""
    if signals.returned is None:
        return None
    used = choice is not None and choice.returned_weight > 0
    if used:
        why = "its validation against the access counts found it predicts held-out clicks"
    elif choice is None:
        why = (
            "no access counts to validate it against (what search returned alone ranked no "
            "better than random in our measurements)"
        )
    else:
        why = "it did not predict held-out clicks better than the access counts alone"
    return {
        "items": int((signals.returned > 0).sum()),
        "weight": float(signals.returned.sum()),
        "used": used,
        "why": why,
    }
