"""The Milvus engine behind the vector-storage interface (``app.vectors.engine.VectorStorage``).

Galleries created with ``NOBACKFILL_VECTOR_ENGINE=milvus`` have ``vector_storage = "milvus"``:
``storage_for`` answers this adapter over the process's one ``MilvusEngine`` for the settings'
(uri, token) (``engine_for``: created on first use, closed when the last app holding it stops),
and searches go to Milvus (``MilvusSearcher``) instead of the in-process FAISS index, so the API
process holds nothing per gallery.

Processes: a Milvus server (``http(s)://…``, production) is shared by the API and the Celery
worker alike. A milvus-lite file is opened by one process only, so with a milvus-lite URI the jobs
must run in the API process (the ``thread`` or ``inline`` runner); the settings refuse
``job_runner=celery`` with a milvus-lite URI rather than let the worker fail on first use.

One difference from the interface's contract, by construction: a write reaches Milvus when the
call returns, not when the caller's SQL transaction commits; a rollback does not undo it. What
keeps the two stores consistent instead: the caller holds the gallery row's lock across the call
and its commit (so writers of one gallery are serialised, which the id reservation needs too);
an upsert or delete is idempotent, so a request retried after a failed commit converges; and the
counts the service reports come from Milvus (``count``), not from a column a rollback would keep.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.settings import Settings
from app.vectors.engine import SCAN_BATCH, Stored, StoredGallery, Upserted
from app.vectors.milvus.engine import MilvusEngine, MilvusGallery, StoredRows
from app.vectors.milvus.layouts import GalleryLayout, choose_layout
from app.vectors.points import lifted_points

COLLECTION_PREFIX = "nobackfill_"

# One engine per (uri, token) in this process, with how many running apps hold it.
_engines: dict[tuple[str, str], tuple[MilvusEngine, int]] = {}
_engines_guard = threading.Lock()


def _key(settings: Settings) -> tuple[str, str]:
    return settings.resolved_milvus_uri, settings.milvus_token


def engine_for(settings: Settings) -> MilvusEngine:
    """The process's engine for the settings' Milvus, connected on first use (the worker and
    the CLI use it without holding it: it then lives as long as the process)."""
    if settings.job_runner == "celery" and settings.milvus_lite:
        # A Celery process (a worker, or the API handing jobs to one) shares galleries with
        # other processes: a milvus-lite file of its own would be empty, not theirs.
        raise RuntimeError(
            "this gallery is stored in Milvus, but this process has no Milvus server: set "
            "NOBACKFILL_VECTOR_ENGINE=milvus and NOBACKFILL_MILVUS_URI=http(s)://host:19530 "
            "(and NOBACKFILL_MILVUS_TOKEN) for the API and every worker alike"
        )
    with _engines_guard:
        key = _key(settings)
        if key not in _engines:
            _engines[key] = (MilvusEngine(key[0], key[1]), 0)
        return _engines[key][0]


def hold_engine(settings: Settings) -> MilvusEngine:
    """An app starting: the engine stays open until the matching ``release_engine``."""
    engine = engine_for(settings)
    with _engines_guard:
        key = _key(settings)
        _engines[key] = (engine, _engines[key][1] + 1)
    return engine


def release_engine(settings: Settings) -> None:
    """An app stopping: the last holder closes the engine (several apps of one process, as in
    the tests' restarts, share one client per Milvus)."""
    with _engines_guard:
        key = _key(settings)
        if key not in _engines:
            return
        engine, holders = _engines[key]
        if holders > 1:
            _engines[key] = (engine, holders - 1)
            return
        del _engines[key]
    engine.close()


def collection_name(gallery_id: str) -> str:
    return f"{COLLECTION_PREFIX}{gallery_id}"


def layout_of(gallery: StoredGallery) -> GalleryLayout:
    """External cosine galleries lie at one radius (the cosine layout, searching the stored
    vectors); model-bound and dot galleries do not (poincare; collections made before that
    layout keep their tangent one, read back from the collection). A flat gallery asks for
    exact search (FLAT)."""
    one_radius = gallery.bound_model_id is None and gallery.metric == "cosine"
    layout, index_type = choose_layout(one_radius, exact=gallery.index_kind == "flat")
    return GalleryLayout(
        collection_name(gallery.id),
        gallery.dim,
        gallery.dim,
        gallery.lift_curv,
        layout,
        index_type,
        # The points of a cosine gallery follow from its stored vectors: one vector per row.
        lift_scale=gallery.lift_scale if one_radius else None,
    )


def _points(gallery: StoredGallery, vectors: np.ndarray) -> np.ndarray:
    return lifted_points(gallery, vectors)


def _stored(rows: StoredRows) -> Stored:
    return Stored(rows.item_ids, rows.row_ids, rows.vectors, rows.labels, rows.metadata)


class MilvusVectorStorage:
    """Gallery vectors in one Milvus collection per gallery, created by the first write (reads
    of a gallery never written answer empty and create nothing)."""

    name = "milvus"

    def __init__(self, engine: MilvusEngine) -> None:
        self.engine = engine

    def existing(self, gallery: StoredGallery) -> MilvusGallery | None:
        name = collection_name(gallery.id)
        return self.engine.open_gallery(name) if self.engine.has_gallery(name) else None

    def gallery(self, gallery: StoredGallery) -> MilvusGallery:
        return self.existing(gallery) or self.engine.create_gallery(layout_of(gallery))

    def upsert(
        self,
        session: Session,
        gallery: StoredGallery,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        metadata: Sequence[dict[str, Any] | None],
    ) -> Upserted:
        store = self.gallery(gallery)
        before = store.lookup(item_ids)
        vectors = np.asarray(vectors, dtype=np.float32)
        points = None if store.layout.lift_scale is not None else _points(gallery, vectors)
        ids = store.upsert(item_ids, vectors, points, labels, metadata, known=before)
        replaced = np.array([row_id for row_id, _ in before.values()], dtype=np.int64)
        return Upserted(ids=ids, replaced=np.sort(replaced), inserted=len(ids) - len(before))

    def delete(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> np.ndarray:
        store = self.existing(gallery)
        if store is None:
            return np.zeros(0, dtype=np.int64)
        present = store.lookup(item_ids)
        store.delete(list(present))
        return np.sort(np.array([row_id for row_id, _ in present.values()], dtype=np.int64))

    def lookup(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        store = self.existing(gallery)
        return {} if store is None else store.lookup(item_ids)

    def fetch(self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]) -> Stored:
        store = self.existing(gallery)
        if store is None:
            return Stored([], np.zeros(0, np.int64), np.zeros((0, gallery.dim), np.float32), [], [])
        return _stored(store.fetch(item_ids))

    def names(
        self, session: Session, gallery: StoredGallery, ids: Sequence[int]
    ) -> dict[int, tuple[str, str | None]]:
        store = self.existing(gallery)
        return {} if store is None else store.names(ids)

    def scan(
        self, session: Session, gallery: StoredGallery, batch: int = SCAN_BATCH
    ) -> Iterator[Stored]:
        store = self.existing(gallery)
        for rows in store.scan(batch) if store is not None else ():
            yield _stored(rows)

    def all_ids(self, session: Session, gallery: StoredGallery) -> np.ndarray:
        store = self.existing(gallery)
        return np.zeros(0, dtype=np.int64) if store is None else store.all_row_ids()

    def count(self, session: Session, gallery: StoredGallery) -> int:
        store = self.existing(gallery)
        return 0 if store is None else store.count()

    def drop(self, gallery_id: str) -> None:
        self.engine.drop_gallery(collection_name(gallery_id))


class MilvusSearcher:
    """A Milvus gallery behind the two index calls the search services make (``ntotal``,
    ``search_with_points``), answered by Milvus with its exact float64 re-rank; built per
    request, it holds no rows, so the API process's memory does not grow with the gallery."""

    def __init__(self, storage: MilvusVectorStorage, gallery: StoredGallery) -> None:
        self.dim = gallery.dim
        self._store = storage.existing(gallery)

    @property
    def ntotal(self) -> int:
        return 0 if self._store is None else self._store.count()

    def search_with_points(
        self, queries: np.ndarray, k: int, *, overfetch: int = 4, min_candidates: int = 64
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(internal ids, float64 distances, points float32) per query, nearest first, −1 / inf /
        NaN padded, as ``LorentzIndex.search_with_points``. ``overfetch`` and ``min_candidates``
        size the FAISS path's candidate list; Milvus fetches its engine's k′ (``MilvusEngine``),
        chosen for its HNSW layouts."""
        queries = np.asarray(queries, dtype=np.float64).reshape(-1, self.dim)
        nq = len(queries)
        if self._store is None or nq == 0:
            return (
                np.full((nq, k), -1, dtype=np.int64),
                np.full((nq, k), np.inf),
                np.full((nq, k, self.dim), np.nan, dtype=np.float32),
            )
        hits = self._store.search(queries, k)
        return hits.row_ids, hits.distances, hits.points.astype(np.float32)


def milvus_storage(settings: Settings) -> MilvusVectorStorage:
    return MilvusVectorStorage(engine_for(settings))
