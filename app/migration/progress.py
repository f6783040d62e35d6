"""How far a gallery's migration has got, per model: items re-embedded, the share of the counted
traffic they cover, and the expected quality of the search now and one plan step further.

The expected figures come from the model's stored backfill fit (``BackfillFit``: the curves
measured on the upgrade's held-out queries with a random share re-embedded) and only when one is
stored: fitting one can take minutes, and a GET must not (the first plan or mixed search stores
it). The transition search's curve is quoted where the fit has one (the held-out queries carried
the old model's vectors), else the bridged mixed search's."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.galleries.models import AccessCount, Gallery
from app.migration import access
from app.migration.models import BackfillFit
from app.ml.backfill.plan import PlannerFit
from app.vectors.tables import ReembeddedVector

# "The next plan step": another tenth of the gallery re-embedded.
PROGRESS_STEP = 0.10


def _at(curve: list[dict[str, Any]], metric: str, fraction: float) -> float | None:
    points = sorted((p["fraction"], p["value"]) for p in curve if p["metric"] == metric)
    if not points:
        return None
    xs, ys = zip(*points, strict=True)
    return float(np.interp(fraction, xs, ys))


def expected_quality(fit: PlannerFit, fraction: float) -> dict[str, Any] | None:
    """The fit's expected figure at ``fraction`` and one ``PROGRESS_STEP`` further."""
    search, curve = ("transition", fit.transition) if fit.transition else ("mixed", fit.expected)
    now = _at(curve or [], fit.metric, fraction)
    if now is None:
        return None
    nxt = min(1.0, fraction + PROGRESS_STEP)
    return {
        "search": search,
        "view": fit.view,
        "metric": fit.metric,
        "now": now,
        "next": {"fraction": nxt, "value": _at(curve or [], fit.metric, nxt)},
    }


def _covered_counts(session: Session, gallery_id: str) -> dict[str, int]:
    """Per model: the access counts of its re-embedded items."""
    rows = session.execute(
        select(ReembeddedVector.model_id, access.sum_of_counts(session))
        .join(
            AccessCount,
            (AccessCount.gallery_id == ReembeddedVector.gallery_id)
            & (AccessCount.vector_id == ReembeddedVector.vector_id),
        )
        .where(ReembeddedVector.gallery_id == gallery_id)
        .group_by(ReembeddedVector.model_id)
    )
    return {model_id: access.saturated(total) for model_id, total in rows}


def progress(session: Session, gallery: Gallery) -> list[dict[str, Any]]:
    """Per model: items re-embedded / items in the gallery, the counted traffic they cover (None
    without access counts) and the expected quality now and at the next step (None without a
    stored fit)."""
    rows = session.execute(
        select(ReembeddedVector.model_id, func.count())
        .where(ReembeddedVector.gallery_id == gallery.id)
        .group_by(ReembeddedVector.model_id)
        .order_by(ReembeddedVector.model_id)
    ).all()
    if not rows:
        return []
    _, clicks = access.counted(session, gallery.id)
    covered = _covered_counts(session, gallery.id) if clicks else {}
    out = []
    for model_id, count in rows:
        fraction = (int(count) / gallery.count) if gallery.count else 0.0
        # The fit's JSON only: the row's reference sample is megabytes a GET does not need.
        stored = session.scalar(select(BackfillFit.fit).where(BackfillFit.model_id == model_id))
        out.append(
            {
                "model_id": model_id,
                "reembedded": int(count),
                "total": gallery.count,
                "fraction": fraction,
                "traffic_covered": covered.get(model_id, 0) / clicks if clicks else None,
                "expected": None
                if stored is None
                else expected_quality(PlannerFit.from_dict(stored), fraction),
            }
        )
    return out
