"""An in-place migration's vectors beside an attached Milvus collection: the re-embedded items'
new features in a sibling collection ``<collection>__nobackfill_<model id>`` of the same
deployment, keyed by the same primary keys — the Milvus twin of ``app.vectors.qdrant.named``.

Why a sibling collection and not a second vector field of the owner's rows (what Qdrant gets):
Milvus adds fields to a live collection only through ``add_collection_field``, which milvus-lite
does not implement at all (it answers UNIMPLEMENTED, measured with milvus-lite 3.x and pymilvus
3.0), nor does a Milvus 2.3 server (UNIMPLEMENTED too, measured on 2.3.5 standalone: the RPC
came with a later release), and which Milvus 2.6's documentation allows for nullable scalar
fields only (newer SDKs' references describe nullable vector fields; no such server was tried
here); and writing one field of an existing row needs a partial upsert that would re-send the
owner's row. A sibling collection needs neither: the owner's collection is never written, its
schema never changes, and everything the service wrote lies in collections whose names say so
(dropping them undoes the migration).

Each sibling row: ``id`` (the owner's primary key, same type), ``vector`` (the new model's
features, FLAT-indexed for COSINE: exact, and the sibling holds only the re-embedded share),
``model_id`` and ``written_at`` (per-vector provenance).

What the sibling cannot do by itself is follow the owner's deletes: a row the owner deletes
keeps its sibling row. So every use checks against the owner's collection: a write keeps only
the keys still present after it (``app.migration.in_place.milvus``), and a search of the sibling
over-fetches and drops hits whose owner row is gone (``search_vector``). The old list of a mixed
search leaves out every key the sibling holds (``keys``), so the two lists never overlap; that
filter lists every re-embedded key in the search expression, read from the sibling per search:
measured only at the tests' hundreds of keys, and its cost grows with the migration.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
from pymilvus import DataType

from app.core.errors import conflict
from app.core.settings import Settings
from app.ml.backfill.mixed import unit_rows
from app.vectors.attached_ids import internal_of, remember
from app.vectors.engine import StoredGallery
from app.vectors.milvus.attach import AttachedCollection
from app.vectors.milvus.attached import READ_BATCH, SEARCH_BATCH, MilvusAttachedStorage
from app.vectors.milvus.search import MAX_TOPK
from app.vectors.milvus.source import MIGRATION_INFIX, MilvusSource, connection, reachable

log = logging.getLogger(__name__)
KEY, VECTOR, MODEL, WRITTEN = "id", "vector", "model_id", "written_at"
MAX_NAME = 255
MAX_KEY = 65535


def migration_collection(collection: str, model_id: str) -> str:
    """The sibling collection holding ``model_id``'s re-embedded items of ``collection``."""
    name = collection + MIGRATION_INFIX + model_id
    if len(name) > MAX_NAME:
        raise conflict(f"the migration's collection name {name[:60]!r}… exceeds {MAX_NAME}")
    return name


def _sibling(storage: MilvusAttachedStorage, gallery: StoredGallery, name: str, dim: int):
    source, conn, _ = storage.collection(gallery)
    rows = AttachedCollection.known(conn.client, name, KEY, VECTOR, dim, source.string_ids)
    return source, conn, rows


def shape(storage: MilvusAttachedStorage, gallery: StoredGallery, name: str) -> int | None:
    """The sibling's vector dimension, None when the deployment has no such collection; 409
    when a collection of that name is not one the service would have made."""
    source, conn, _ = storage.collection(gallery)
    with reachable(source), conn.use() as client:
        if not client.has_collection(name):
            return None
        fields = {f["name"]: f for f in client.describe_collection(name)["fields"]}
        indexes = [client.describe_index(name, i) for i in client.list_indexes(name)]
    vector = fields.get(VECTOR)
    metrics = {str(i.get("metric_type")) for i in indexes}
    if vector is None or vector["type"] != DataType.FLOAT_VECTOR or metrics != {"COSINE"}:
        raise conflict(
            f"the deployment's collection {name!r} is not an in-place migration's sibling "
            "collection (a COSINE-indexed FLOAT_VECTOR field 'vector'); it is not the "
            "service's to change"
        )
    return int(vector["params"]["dim"])


def ensure_collection(
    storage: MilvusAttachedStorage, gallery: StoredGallery, name: str, dim: int
) -> None:
    """Create the sibling (loaded, Strong consistency) unless it exists; 409 when it exists with
    another dimension."""
    existing = shape(storage, gallery, name)
    if existing is not None:
        if existing != dim:
            raise conflict(
                f"the collection {name!r} holds {existing}-dimensional vectors, not the model's "
                f"{dim}-dimensional features; it is not the service's to change"
            )
        return
    source, conn, _ = storage.collection(gallery)
    with reachable(source), conn.use() as client:
        schema = client.create_schema(auto_id=False)
        if source.string_ids:
            schema.add_field(KEY, DataType.VARCHAR, is_primary=True, max_length=MAX_KEY)
        else:
            schema.add_field(KEY, DataType.INT64, is_primary=True)
        schema.add_field(VECTOR, DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field(MODEL, DataType.VARCHAR, max_length=64)
        schema.add_field(WRITTEN, DataType.VARCHAR, max_length=64)
        index = client.prepare_index_params()
        index.add_index(VECTOR, index_type="FLAT", metric_type="COSINE")
        client.create_collection(
            name, schema=schema, index_params=index, consistency_level="Strong"
        )


def write(
    storage: MilvusAttachedStorage,
    gallery: StoredGallery,
    name: str,
    model_id: str,
    keys: Sequence[int | str],
    features: np.ndarray,
    written_at: str,
) -> None:
    """The sibling rows of ``keys`` (rows of ``features``) and their provenance."""
    source, conn, _ = storage.collection(gallery)
    for start in range(0, len(keys), READ_BATCH):
        part = keys[start : start + READ_BATCH]
        rows = features[start : start + READ_BATCH].astype(np.float32)
        data = [
            {KEY: key, VECTOR: row.tolist(), MODEL: model_id, WRITTEN: written_at}
            for key, row in zip(part, rows, strict=True)
        ]
        with reachable(source), conn.use() as client:
            client.upsert(name, data)


def remove(
    storage: MilvusAttachedStorage, gallery: StoredGallery, name: str, keys: Sequence[int | str]
) -> None:
    """Drop the sibling rows of ``keys`` (their owner rows are gone)."""
    source, conn, rows = _sibling(storage, gallery, name, gallery.dim)
    for start in range(0, len(keys), READ_BATCH):
        expr = rows.ids_filter(keys[start : start + READ_BATCH])
        with reachable(source), conn.use() as client:
            client.delete(name, filter=expr)


def forget_models(
    settings: Settings, gallery_id: str, source: MilvusSource, model_ids: Iterable[str]
) -> None:
    """Drop each model's sibling collection once its re-embedded items were deleted (committed):
    everything the service wrote for the model lies there. Best effort: a deployment out of
    reach keeps it (logged); no search of the service reads it any more."""
    conn = connection(settings, source)
    for model_id in model_ids:
        name = source.collection + MIGRATION_INFIX + model_id
        try:
            with reachable(source), conn.use() as client:
                if client.has_collection(name):
                    client.drop_collection(name)
        except Exception:
            log.warning(
                "could not drop model %s's collection %s of gallery %s",
                model_id,
                name,
                gallery_id,
                exc_info=True,
            )


def keys(storage: MilvusAttachedStorage, gallery: StoredGallery, name: str) -> list[int | str]:
    """Every key the sibling holds (the rows a mixed search's old list leaves out)."""
    source, conn, rows = _sibling(storage, gallery, name, gallery.dim)
    pages = rows.iterate(10 * READ_BATCH, vectors=False)
    out: list[int | str] = []
    while True:
        with reachable(source), conn.use():
            page = next(pages, None)
        if page is None:
            return out
        out.extend(row[KEY] for row in page)


def search_vector(
    storage: MilvusAttachedStorage, gallery: StoredGallery, name: str, features: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(internal ids, cosines) of the k rows nearest each row of ``features`` in the sibling,
    best first (ids −1 padded), among those whose owner row still exists. The cosines are
    recomputed from the hits' vectors in float32 as the service's own scan of re-embedded
    features computes them, so the merge scores a hit the same wherever it is kept. Twice k
    are fetched: a query loses hits only when more than k of its 2k lost their owner row."""
    queries = unit_rows(features)
    source, conn, rows = _sibling(storage, gallery, name, queries.shape[1])
    owner = storage.collection(gallery)[2]
    nq = len(queries)
    ids = np.full((nq, k), -1, dtype=np.int64)
    cosines = np.full((nq, k), -1.0, dtype=np.float32)
    limit = min(2 * k, MAX_TOPK)
    for start in range(0, nq, SEARCH_BATCH):
        part = queries[start : start + SEARCH_BATCH]
        with reachable(source), conn.use():
            answers = rows.search_rows(part, limit)
            present = owner.existing([key for hits in answers for key, _ in hits])
        for offset, hits in enumerate(answers):
            hits = [(key, vector) for key, vector in hits if key in present]
            if not hits:
                continue
            remember(gallery.id, [key for key, _ in hits])
            found = unit_rows(np.stack([vector for _, vector in hits]))
            scores = found @ part[offset]
            order = np.argsort(-scores, kind="stable")[:k]
            row = start + offset
            ids[row, : len(order)] = [internal_of(hits[i][0]) for i in order.tolist()]
            cosines[row, : len(order)] = scores[order]
    return ids, cosines
