"""Document texts and in-place vectors of an attached Qdrant collection's points, for a two-stage
search and a re-embed job on it (issue 43, item 2): the texts come from a payload key the attach
named (``source.text_field``), the model's vectors from the in-place migration's named vector
(``app.vectors.qdrant.named``). One ``retrieve`` per batch of ``READ_BATCH`` points each.

Qdrant has no payload schema: a key is "in the collection" when points carry it. The attach
checks with one ``scroll`` of limit 1 filtered to points whose key is present and not empty: a
collection none of whose points carry the key is refused (a misspelt key would otherwise make
every later search embed nothing). An empty collection has nothing to check and is accepted.
Points that lack the key later, or hold an empty or non-string value there, are skipped and
counted by the callers, not an error: the owner's payload is theirs to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from qdrant_client import models

from app.core.errors import Problem, invalid
from app.core.settings import Settings
from app.vectors import attached_ids
from app.vectors.engine import StoredGallery
from app.vectors.qdrant.source import QdrantSource, connection, is_unreachable, reachable
from app.vectors.qdrant.storage import READ_BATCH, QdrantVectorStorage


def check_text_field(settings: Settings, source: QdrantSource) -> None:
    """422 naming ``source.text_field`` when the collection has points and none carries the
    key with a value (one scroll of limit 1; see the module docstring)."""
    field = source.text_field
    if field is None:
        return
    carrying = models.Filter(
        must_not=[models.IsEmptyCondition(is_empty=models.PayloadField(key=field))]
    )
    try:
        with connection(settings, source).use() as client:
            if client.count(source.collection, exact=True).count == 0:
                return
            found, _ = client.scroll(
                source.collection,
                scroll_filter=carrying,
                limit=1,
                with_payload=[field],
                with_vectors=False,
            )
    except Problem:
        raise
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        where = "source.url" if source.url is not None else "source.path"
        raise invalid(where, f"the Qdrant server is unreachable: {exc}") from exc
    if not found:
        raise invalid(
            "source.text_field",
            f"no point of collection {source.collection!r} has a payload key {field!r} with a "
            "value: name the key holding each point's document text",
        )


def _retrieve(
    storage: QdrantVectorStorage,
    gallery: StoredGallery,
    item_ids: Sequence[str],
    *,
    payload: list[str] | bool = False,
    vectors: list[str] | bool = False,
) -> list[Any]:
    source = storage.source(gallery)
    points = [p for p in (attached_ids.point_of(item) for item in item_ids) if p is not None]
    conn = connection(storage.settings, source)
    out: list[Any] = []
    for start in range(0, len(points), READ_BATCH):
        with reachable(source), conn.use() as client:
            out.extend(
                client.retrieve(
                    source.collection,
                    points[start : start + READ_BATCH],
                    with_payload=payload,
                    with_vectors=vectors,
                )
            )
    return out


def read_texts(
    storage: QdrantVectorStorage, gallery: StoredGallery, field: str, item_ids: Sequence[str]
) -> dict[str, str]:
    """item id → its text, for the points that exist and hold a non-empty string under
    ``field`` (the others are left out)."""
    out: dict[str, str] = {}
    for record in _retrieve(storage, gallery, item_ids, payload=[field]):
        text = (record.payload or {}).get(field)
        if isinstance(text, str) and text.strip():
            out[attached_ids.item_id(record.id)] = text
    return out


def read_vectors(
    storage: QdrantVectorStorage, gallery: StoredGallery, name: str, item_ids: Sequence[str]
) -> tuple[list[str], np.ndarray]:
    """(item ids, their rows of the named vector ``name``) of the points that carry it."""
    items, rows = [], []
    for record in _retrieve(storage, gallery, item_ids, vectors=[name]):
        vector = record.vector.get(name) if isinstance(record.vector, dict) else None
        if vector is not None:
            items.append(attached_ids.item_id(record.id))
            rows.append(vector)
    return items, np.asarray(rows, dtype=np.float32).reshape(len(items), -1)
