"""Document texts and in-place vectors of an attached Milvus collection's rows, for a two-stage
search and a re-embed job on it (issue 43, item 2) — the Milvus twin of
``app.vectors.qdrant.texts``: the texts come from a VARCHAR field the attach named
(``source.text_field``, checked against the collection's schema), the model's vectors from the
in-place migration's sibling collection (``app.vectors.milvus.sibling``). One query per batch of
``ID_BATCH`` keys, at Strong consistency as every read of an attached collection.

Rows whose text is null or empty are skipped and counted by the callers, not an error.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pymilvus import DataType

from app.core.errors import Problem, invalid
from app.core.settings import Settings
from app.vectors.attached_ids import item_id
from app.vectors.engine import StoredGallery
from app.vectors.milvus import sibling as milvus_sibling
from app.vectors.milvus.attach import ID_BATCH, STRONG, AttachedCollection
from app.vectors.milvus.attached import MilvusAttachedStorage, point_of
from app.vectors.milvus.source import MilvusSource, connection, is_unreachable, reachable


def check_text_field(settings: Settings, source: MilvusSource) -> None:
    """422 naming ``source.text_field`` unless it is a VARCHAR field of the collection."""
    field = source.text_field
    if field is None:
        return
    try:
        with connection(settings, source).use() as client:
            fields = client.describe_collection(source.collection)["fields"]
    except Problem:
        raise
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        raise invalid("source.uri", f"the Milvus server is unreachable: {exc}") from exc
    found = {f["name"]: f for f in fields}.get(field)
    if found is None or found["type"] != DataType.VARCHAR:
        names = sorted(f["name"] for f in fields if f["type"] == DataType.VARCHAR)
        raise invalid(
            "source.text_field",
            f"{field!r} is not a VARCHAR field of collection {source.collection!r} (its VARCHAR "
            f"fields: {names}): name the field holding each row's document text",
        )


def _keys(storage: MilvusAttachedStorage, gallery: StoredGallery, items: Sequence[str]) -> list:
    string_ids = storage.source(gallery).string_ids
    return [k for k in (point_of(item, string_ids) for item in items) if k is not None]


def read_texts(
    storage: MilvusAttachedStorage, gallery: StoredGallery, field: str, item_ids: Sequence[str]
) -> dict[str, str]:
    """item id → its text, for the rows that exist and hold a non-empty text in ``field``."""
    source, conn, rows = storage.collection(gallery)
    keys = list(dict.fromkeys(_keys(storage, gallery, item_ids)))
    out: dict[str, str] = {}
    for start in range(0, len(keys), ID_BATCH):
        with reachable(source), conn.use() as client:
            found = client.query(
                source.collection,
                filter=rows.ids_filter(keys[start : start + ID_BATCH]),
                output_fields=[source.id_field, field],
                consistency_level=STRONG,
            )
        for row in found:
            text = row.get(field)
            if isinstance(text, str) and text.strip():
                out[item_id(row[source.id_field])] = text
    return out


def read_vectors(
    storage: MilvusAttachedStorage, gallery: StoredGallery, name: str, item_ids: Sequence[str]
) -> tuple[list[str], np.ndarray]:
    """(item ids, their vectors) of the rows the sibling collection ``name`` holds (none when
    it does not exist yet)."""
    dim = milvus_sibling.shape(storage, gallery, name)
    if dim is None:
        return [], np.zeros((0, 0), dtype=np.float32)
    source, conn, _ = storage.collection(gallery)
    sibling = AttachedCollection.known(
        conn.client, name, milvus_sibling.KEY, milvus_sibling.VECTOR, dim, source.string_ids
    )
    with reachable(source), conn.use():
        keys, vectors = sibling.fetch_vectors(_keys(storage, gallery, item_ids))
    return [item_id(k) for k in keys], vectors
