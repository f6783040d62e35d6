"""What an in-place migration of any attached collection (Qdrant: ``app.migration.in_place``;
Milvus: ``app.migration.in_place.milvus``) does on the service's side: refuse ids that can name no
point, and count the items written under the upload's locks (one ``ReembeddedVector`` row each,
``features`` NULL: the collection holds the vectors), reporting those skipped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from app.core.errors import FieldError, invalid_fields
from app.galleries.models import Gallery
from app.migration.reembed import locked_upload, reembedded_count, replace_rows
from app.models.models import TrainedModel
from app.vectors.faiss.index_store import IndexStore


def refuse_unnamed(ids: list[str], point_of: Callable[[str], object], what: str) -> None:
    """422 naming every id (up to 20) that cannot name a point of the collection."""
    unnamed = [n for n, item in enumerate(ids) if point_of(item) is None]
    if unnamed:
        raise invalid_fields(
            [FieldError(f"ids[{n}]", f"{ids[n]!r} names no point ({what})") for n in unnamed[:20]]
        )


def store_written(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    ids: list[str],
    write_present: Callable[[Gallery], dict[int, int]],
) -> dict[str, Any]:
    """Under the upload's locks: ``write_present`` writes the items whose point exists into the
    collection (position in ``ids`` → internal id), then their rows are counted and committed;
    the upload's answer, the ids skipped included."""
    with locked_upload(session, store, gallery, row) as gallery:
        written = write_present(gallery)
        kept = sorted(written)
        replace_rows(session, gallery, row.id, [written[n] for n in kept], [None] * len(kept))
        session.commit()
    out: dict[str, Any] = {
        "upserted": len(kept),
        "count": gallery.count,
        "reembedded": reembedded_count(session, gallery.id, row.id),
    }
    skipped = sorted(set(range(len(ids))) - set(kept))
    if skipped:
        out["skipped"] = [ids[n] for n in skipped]
    return out
