"""The vector-storage interface: every reader and writer of a gallery's stored vectors goes
through it, so the storage behind it (SQL rows, append-only segment files, a vector database)
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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from sqlalchemy.orm import Session

from app.galleries.models import Gallery

if TYPE_CHECKING:
    from app.core.settings import Settings

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


class VectorStorage(Protocol):
    """One storage of gallery vectors. ``gallery`` is the caller's row (its committed state, or
    the state the caller's transaction is about to commit, locked by the caller for writes)."""

    name: str

    def upsert(
        self,
        session: Session,
        gallery: Gallery,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        metadata: Sequence[dict[str, Any] | None],
    ) -> Upserted:
        """Insert or replace items (distinct ids); an existing item keeps its internal id."""
        ...

    def delete(self, session: Session, gallery: Gallery, item_ids: Sequence[str]) -> np.ndarray:
        """Remove the items the gallery holds (others are ignored); returns their internal ids."""
        ...

    def lookup(
        self, session: Session, gallery: Gallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        """Which of ``item_ids`` exist: item id → (internal id, label)."""
        ...

    def fetch(self, session: Session, gallery: Gallery, item_ids: Sequence[str]) -> Stored:
        """The stored items among ``item_ids``, in the order asked (absent ones left out)."""
        ...

    def names(
        self, session: Session, gallery: Gallery, ids: Sequence[int]
    ) -> dict[int, tuple[str, str | None]]:
        """Internal id → (item id, label), for the ids that exist."""
        ...

    def scan(self, session: Session, gallery: Gallery, batch: int = SCAN_BATCH) -> Iterator[Stored]:
        """Every stored item, in batches, ascending internal id."""
        ...

    def all_ids(self, session: Session, gallery: Gallery) -> np.ndarray:
        """Every internal id (int64), ascending."""
        ...

    def count(self, session: Session, gallery: Gallery) -> int:
        """Items stored."""
        ...

    def drop(self, gallery_id: str) -> None:
        """After the gallery's row was deleted and committed: free what lives outside the
        database (the row's cascade removed what lives inside)."""
        ...


# ``Gallery.vector_storage`` of a gallery kept in Milvus (vectors and search both there).
MILVUS = "milvus"


def storage_for(session: Session, gallery: Gallery) -> VectorStorage:
    """The storage holding ``gallery``'s vectors (its ``vector_storage``); segment files and the
    Milvus connection follow the settings the session was opened with."""
    if gallery.vector_storage == "segments":
        from app.vectors.segments import segment_storage

        return segment_storage(vectors_dir(session))
    if gallery.vector_storage == MILVUS:
        from app.search.milvus_storage import milvus_storage

        return milvus_storage(session_settings(session))
    from app.vectors.sql import SqlVectorStorage

    return SqlVectorStorage()


def session_settings(session: Session) -> Settings:
    from app.core.settings import get_settings

    return session.info.get("settings") or get_settings()


def vectors_dir(session: Session) -> Path:
    return session_settings(session).data_dir / "vectors"
