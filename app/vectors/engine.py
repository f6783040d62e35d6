"""The vector-storage interface: every reader and writer of a gallery's stored vectors goes
through it (``app.vectors.storage.storage_for`` picks a gallery's), so the storage behind it (SQL rows, append-only segment files, a vector database)
can change without touching the services.

Transactions: a write is *staged* in the caller's session (with the gallery row locked by the
caller) and becomes durable and visible when the caller commits; a rolled-back write leaves no
trace a reader can see. Internal ids are stable int64s, unique within a gallery, never reused for
another item of it while it exists: they are the FAISS ids and what re-embedded features point
at. Vectors are float32 as stored (the uploaded Euclidean vector, or a model's space components).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sqlalchemy.orm import Session

# Rows per batch of a scan (an index rebuild reads a gallery in batches of this size).
SCAN_BATCH = 50_000


@dataclass(frozen=True)
class Stored:
    """Stored items, row n describing ``item_ids[n]``."""

    item_ids: list[str]
    ids: np.ndarray  # int64 internal ids
    vectors: np.ndarray  # n × dim float32
    labels: list[str | None]
    metadata: list[dict[str, Any] | None]

    def __len__(self) -> int:
        return len(self.item_ids)


@dataclass(frozen=True)
class Upserted:
    ids: np.ndarray  # internal id of every upserted item, in the order given
    replaced: np.ndarray  # internal ids of the items that existed before (their content changed)
    inserted: int  # items new to the gallery


class StoredGallery(Protocol):
    """What storage needs of a gallery: plain data (in the service, the ORM row of
    ``app.galleries.models``; in a benchmark, anything with these attributes). Storage reads them
    and writes only ``vector_manifest`` (the segment files' commit point)."""

    id: str
    dim: int  # Euclidean dimension of a stored vector
    vector_storage: str  # "sql", "segments", MILVUS, QDRANT, ATTACHED_MILVUS or ATTACHED_PGVECTOR
    vector_manifest: dict[str, Any] | None
    # How stored vectors become Lorentz space components (``app.vectors.points``).
    bound_model_id: str | None  # set: vectors are already a model's space components
    metric: str | None
    lift_curv: float
    lift_scale: float | None
    index_kind: str  # "flat" asks an engine for exact search
    # QDRANT / ATTACHED_MILVUS: the attached collection (``app.vectors.qdrant.source.QdrantSource``,
    # ``app.vectors.milvus.source.MilvusSource``, ``app.vectors.pgvector.source.PgvectorSource``);
    # else None.
    source: dict[str, Any] | None


class VectorStorage(Protocol):
    """One storage of gallery vectors. ``gallery`` is the caller's row (its committed state, or
    the state the caller's transaction is about to commit, locked by the caller for writes)."""

    name: str

    def upsert(
        self,
        session: Session,
        gallery: StoredGallery,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        metadata: Sequence[dict[str, Any] | None],
    ) -> Upserted:
        """Insert or replace items (distinct ids); an existing item keeps its internal id."""
        ...

    def delete(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> np.ndarray:
        """Remove the items the gallery holds (others are ignored); returns their internal ids."""
        ...

    def lookup(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        """Which of ``item_ids`` exist: item id → (internal id, label)."""
        ...

    def fetch(self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]) -> Stored:
        """The stored items among ``item_ids``, in the order asked (absent ones left out)."""
        ...

    def names(
        self, session: Session, gallery: StoredGallery, ids: Sequence[int]
    ) -> dict[int, tuple[str, str | None]]:
        """Internal id → (item id, label), for the ids that exist."""
        ...

    def scan(
        self, session: Session, gallery: StoredGallery, batch: int = SCAN_BATCH
    ) -> Iterator[Stored]:
        """Every stored item, in batches, ascending internal id."""
        ...

    def all_ids(self, session: Session, gallery: StoredGallery) -> np.ndarray:
        """Every internal id (int64), ascending."""
        ...

    def count(self, session: Session, gallery: StoredGallery) -> int:
        """Items stored."""
        ...

    def drop(self, gallery_id: str) -> None:
        """After the gallery's row was deleted and committed: free what lives outside the
        database (the row's cascade removed what lives inside)."""
        ...


# ``vector_storage`` of a gallery kept in Milvus (vectors and search both there).
MILVUS = "milvus"
# ``vector_storage`` of a gallery attached to a Qdrant collection (read-only; search there too).
QDRANT = "qdrant"
# ``vector_storage`` of a gallery attached to a Milvus collection of its owner's (read-only).
ATTACHED_MILVUS = "milvus_attached"
# ``vector_storage`` of a gallery attached to a pgvector table of its owner's (read-only); the
# column holds 16 characters.
ATTACHED_PGVECTOR = "pgvector"
# Galleries reading a collection their owner keeps: the service never writes its vectors.
ATTACHED = (QDRANT, ATTACHED_MILVUS, ATTACHED_PGVECTOR)
# Storages that search their own vectors: no FAISS index of the gallery lives in this process.
SEARCHED_IN_ENGINE = (MILVUS, QDRANT, ATTACHED_MILVUS, ATTACHED_PGVECTOR)
