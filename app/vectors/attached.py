"""What every attached storage shares (Qdrant, Milvus, pgvector): a collection or table its owner
keeps, behind the vector-storage interface read-only (``ReadOnlyStorage``), and behind the index
calls of the search services (``AttachedSearcher``).

The service never writes to an attached collection: ``upsert`` and ``delete`` refuse with the
engine's 409 (the galleries service refuses before them, with the same answer). Internal ids are
named from the attach's id map (``app.vectors.attached_ids``) without asking the engine: the
callers name ids a search or scan of the collection has just returned. The count is the
collection's own, now; detaching frees nothing outside the database. Each engine's subclass says
where a gallery's source is (``source``), how its refusal reads (``refusal``) and how it reads
rows (``lookup``, ``fetch``, ``scan``, ``all_ids``, ``points``); one whose rows have integer or
string keys (Milvus, pgvector) takes the keys of item ids from ``KeyedStorage``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from sqlalchemy.orm import Session

from app.core.settings import Settings
from app.vectors import attached_ids
from app.vectors.engine import StoredGallery, Upserted

Source = TypeVar("Source")


class ReadOnlyStorage(ABC, Generic[Source]):
    """An attached collection behind ``app.vectors.engine.VectorStorage``, read-only."""

    name: str

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @abstractmethod
    def source(self, gallery: StoredGallery) -> Source:
        """Where the gallery's collection is (its ``source``, read back)."""

    @abstractmethod
    def refusal(self, gallery_id: str) -> Exception:
        """The 409 a write to the gallery answers, naming where its owner changes it."""

    @abstractmethod
    def points(self, gallery: StoredGallery) -> int:
        """Points (rows with a vector) in the collection now."""

    def upsert(
        self,
        session: Session,
        gallery: StoredGallery,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        metadata: Sequence[dict[str, Any] | None],
    ) -> Upserted:
        raise self.refusal(gallery.id)

    def delete(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> np.ndarray:
        raise self.refusal(gallery.id)

    def names(
        self, session: Session, gallery: StoredGallery, ids: Sequence[int]
    ) -> dict[int, tuple[str, str | None]]:
        # Named without asking the engine: the callers name ids a search or scan has just
        # returned (plain ids name themselves; mapped ones come from the attach's id map).
        return {i: (item, None) for i, item in attached_ids.names(session, gallery.id, ids).items()}

    def count(self, session: Session, gallery: StoredGallery) -> int:
        return self.points(gallery)

    def drop(self, gallery_id: str) -> None:
        """Detaching leaves the collection as it is: the gallery's row (and its id map) is all
        the service had."""


class KeyedSource(Protocol):
    """A source whose rows have integer keys, or string keys when ``string_ids``."""

    @property
    def string_ids(self) -> bool: ...


Keyed = TypeVar("Keyed", bound=KeyedSource)


class KeyedStorage(ReadOnlyStorage[Keyed]):
    """An attached collection or table whose rows have integer or string keys (a Milvus primary
    key, a pgvector id column)."""

    def _keys(self, gallery: StoredGallery, item_ids: Sequence[str]) -> list[int | str]:
        """The distinct keys the item ids name, in the order asked (ids naming none left out:
        ``attached_ids.key_of``)."""
        string_ids = self.source(gallery).string_ids
        keys = (attached_ids.key_of(item, string_ids) for item in item_ids)
        return list(dict.fromkeys(key for key in keys if key is not None))


Storage = TypeVar("Storage", bound=ReadOnlyStorage[Any])


class AttachedSearcher(Generic[Storage]):
    """An attached collection behind the index calls the search services make (``ntotal`` here,
    ``search_with_points`` in each engine's subclass); built per request, it holds no rows."""

    def __init__(self, storage: Storage, gallery: Any) -> None:
        self.dim = gallery.dim
        self._storage = storage
        self._gallery = gallery

    @property
    def ntotal(self) -> int:
        return self._storage.points(self._gallery)
