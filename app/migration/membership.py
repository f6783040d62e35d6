"""What a gallery's click log says of the items re-embedded for a model (issue 42, item 6): the
summary ``app.ml.backfill.membership`` turns into each list's lift in a mixed or transition
search. Two aggregates over the gallery's access counts (``app.migration.access``): the log's
totals, and its counts on the re-embedded items (re-embedded rows exist for every gallery,
attached ones included, so the join counts in-place re-embeddings too).

Read per search, not cached: the log and the re-embedded set both change while a migration runs,
and a stale lift would rank by a set that no longer exists. The aggregates read only the
gallery's access rows (the items with a count), typically far fewer than its items.
"""

from __future__ import annotations

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from app.galleries.models import AccessCount, Gallery
from app.migration.access import saturated, sum_of_counts
from app.ml.backfill.membership import NO_LIFTS, ClickSummary, membership_lifts
from app.vectors.tables import ReembeddedVector


def click_summary(
    session: Session, gallery: Gallery, model_id: str, reembedded: int
) -> ClickSummary | None:
    """The log's summary for the model's ``reembedded`` items of the gallery; None without
    clicks (no evidence)."""
    total, singletons = session.execute(
        select(
            sum_of_counts(session),
            func.coalesce(func.sum(case((AccessCount.count == 1, 1), else_=0)), 0),
        ).where(AccessCount.gallery_id == gallery.id)
    ).one()
    clicks = saturated(total)
    if clicks <= 0:
        return None
    on_reembedded = session.scalar(
        select(sum_of_counts(session))
        .select_from(AccessCount)
        .join(
            ReembeddedVector,
            and_(
                ReembeddedVector.gallery_id == AccessCount.gallery_id,
                ReembeddedVector.vector_id == AccessCount.vector_id,
            ),
        )
        .where(AccessCount.gallery_id == gallery.id, ReembeddedVector.model_id == model_id)
    )
    return ClickSummary(
        items=max(int(gallery.count), reembedded),
        clicks=clicks,
        singletons=int(singletons),
        reembedded=reembedded,
        reembedded_clicks=saturated(on_reembedded),
    )


def lifts_of(
    session: Session, gallery: Gallery, model_id: str, reembedded: int
) -> tuple[float, float]:
    """(L_R, L_Rᶜ) of a mixed search of the gallery with the model's ``reembedded`` items."""
    if reembedded <= 0:
        return NO_LIFTS
    return membership_lifts(click_summary(session, gallery, model_id, reembedded))
