"""Document texts of an attached collection's items, and the new vectors embedded from them
written in place (issue 43, item 2): what lets a two-stage search (``app.search.two_stage``) and
a re-embed job (``app.migration.reembed_job``) run on an attached Qdrant or Milvus collection or
pgvector table.

The texts are read from the collection itself, in the payload key (Qdrant), VARCHAR field
(Milvus) or text column (pgvector) the attach named (``source.text_field``;
``app.vectors.qdrant.texts``, ``app.vectors.milvus.texts``, ``app.vectors.pgvector.texts``,
through ``app.migration.in_place.read_texts``), batched; an item whose text is missing, empty or
not a string is left out (the callers skip and count it). The vectors embedded from them are
written exactly as uploaded re-embedded vectors of an attached collection are
(``in_place.store_in_place``: the model's named vector in Qdrant, its sibling collection in
Milvus, its column in pgvector, and the service's counting rows), so plan, progress, mixed and
transition searches see them as any in-place migration's.
A stored gallery's texts are its ``GalleryText`` rows (``app.galleries.service.item_texts``).
"""

from __future__ import annotations

import numpy as np
from sqlalchemy.orm import Session

from app.core.errors import conflict
from app.galleries.models import Gallery
from app.galleries.service import item_texts
from app.migration import in_place
from app.migration.reembed import EmbeddedTexts
from app.ml.backfill.mixed import unit_rows
from app.models.models import TrainedModel
from app.vectors.engine import ATTACHED
from app.vectors.faiss.index_store import IndexStore
from app.vectors.storage import session_settings


def text_field(gallery: Gallery) -> str | None:
    """The attached gallery's text field (None: none named, or not an attached gallery)."""
    if gallery.vector_storage not in ATTACHED:
        return None
    return (gallery.source or {}).get("text_field")


def refuse_without_texts(gallery: Gallery, what: str) -> None:
    """409 for ``what`` (a two-stage search, a re-embed job) on an attached gallery whose
    source names no text field: the service has no texts of its items to embed."""
    if gallery.vector_storage in ATTACHED and text_field(gallery) is None:
        raise conflict(
            f"{what} embeds items' document texts, and attached gallery {gallery.id} names no "
            "field holding them: attach the collection again with `source.text_field` (the "
            "payload key, Milvus VARCHAR field or pgvector text column of each item's text), or "
            "use a transition search"
        )


def texts_of(session: Session, gallery: Gallery, names: dict[int, str]) -> dict[int, str]:
    """Internal id → document text of the items ``names`` (internal id → item id) that have one:
    a stored gallery's stored texts, an attached one's read from its collection (one request
    per batch)."""
    if gallery.vector_storage not in ATTACHED:
        return item_texts(session, gallery.id, list(names))
    field = text_field(gallery)
    if field is None or not names:
        return {}
    found = in_place.read_texts(session_settings(session), gallery, field, list(names.values()))
    return {v: found[item] for v, item in names.items() if item in found}


def in_place_vectors(
    session: Session, gallery: Gallery, model_id: str, names: dict[int, str]
) -> tuple[np.ndarray, np.ndarray]:
    """(internal ids, unit rows) of the model's vectors the attached collection holds for the
    items ``names`` (internal id → item id): Qdrant's named vector, Milvus's sibling rows,
    pgvector's column."""
    settings = session_settings(session)
    items, rows = in_place.read_vectors(settings, gallery, model_id, list(names.values()))
    internal = {item: v for v, item in names.items()}
    ids = np.asarray([internal[item] for item in items], dtype=np.int64)
    return ids, (unit_rows(rows) if len(items) else rows)


def store_embedded_in_place(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    embedded: EmbeddedTexts,
) -> list[int]:
    """Write vectors embedded from the items' texts in place, as an upload of them would
    (``in_place.store_in_place``; committed). An item whose text changed since it was read, or
    whose point is gone, is left out. Returns the internal ids written."""
    names, texts, matrix = embedded.names, embedded.texts, embedded.matrix
    vector_ids = list(names)
    now = texts_of(session, gallery, names)
    keep = [n for n, v in enumerate(vector_ids) if now.get(v) == texts[v]]
    if not keep:
        return []
    ids = [names[vector_ids[n]] for n in keep]
    answer = in_place.store_in_place(session, store, gallery, row, (ids, matrix[keep]))
    skipped = set(answer.get("skipped") or ())
    return [vector_ids[n] for n in keep if names[vector_ids[n]] not in skipped]
