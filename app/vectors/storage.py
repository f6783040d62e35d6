"""Which storage holds a gallery's vectors (its ``vector_storage``), what searches them where that
is the engine itself, and where the storages keep what lives outside the database; segment files
and the Milvus connection follow the settings the session was opened with.

The registry of engines: the one module of ``app.vectors`` that imports the engine subpackages
(``faiss``, ``milvus``, ``qdrant``, ``pgvector``). They import only the shared core (the
interface of ``engine``, the rows, the re-rank, the rules of attached sources), never each other
nor this module, and the core imports none of them ([tool.importlinter] in pyproject.toml says
so by name): so adding an engine is adding a folder and a branch here. The choice stays inside
``app.vectors`` because every layer above asks for a gallery's storage; the subpackages load
when a gallery first needs them (pymilvus, qdrant-client and psycopg are imported by their
engine alone).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from app.core.settings import Settings, get_settings
from app.vectors.engine import (
    ATTACHED_MILVUS,
    ATTACHED_PGVECTOR,
    MILVUS,
    QDRANT,
    StoredGallery,
    VectorStorage,
)

if TYPE_CHECKING:
    from app.vectors.milvus.attached import MilvusAttachedSearcher
    from app.vectors.milvus.storage import MilvusSearcher
    from app.vectors.pgvector.storage import PgvectorSearcher
    from app.vectors.qdrant.storage import QdrantSearcher

    EngineSearcher = MilvusSearcher | QdrantSearcher | MilvusAttachedSearcher | PgvectorSearcher


def storage_for(session: Session, gallery: StoredGallery) -> VectorStorage:
    """The storage holding ``gallery``'s vectors (its ``vector_storage``); segment files and the
    Milvus connection follow the settings the session was opened with."""
    if gallery.vector_storage == "segments":
        from app.vectors.faiss.segments import segment_storage

        return segment_storage(vectors_dir(session))
    if gallery.vector_storage == MILVUS:
        from app.vectors.milvus.storage import milvus_storage

        return milvus_storage(session_settings(session))
    if gallery.vector_storage == QDRANT:
        from app.vectors.qdrant.storage import qdrant_storage

        return qdrant_storage(session_settings(session))
    if gallery.vector_storage == ATTACHED_MILVUS:
        from app.vectors.milvus.attached import milvus_attached_storage

        return milvus_attached_storage(session_settings(session))
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        from app.vectors.pgvector.storage import pgvector_storage

        return pgvector_storage(session_settings(session))
    from app.vectors.sql import SqlVectorStorage

    return SqlVectorStorage()


def engine_searcher(session: Session, gallery: StoredGallery) -> EngineSearcher | None:
    """What searches a gallery whose engine searches its own vectors (``SEARCHED_IN_ENGINE``):
    a searcher with the FAISS index's ``ntotal`` and ``search_with_points`` that holds nothing
    (built per request); None for a gallery searched by its in-process FAISS index."""
    if gallery.vector_storage == QDRANT:
        from app.vectors.qdrant.storage import QdrantSearcher, qdrant_storage

        return QdrantSearcher(qdrant_storage(session_settings(session)), gallery)
    if gallery.vector_storage == ATTACHED_MILVUS:
        from app.vectors.milvus.attached import MilvusAttachedSearcher, milvus_attached_storage

        return MilvusAttachedSearcher(milvus_attached_storage(session_settings(session)), gallery)
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        from app.vectors.pgvector.storage import PgvectorSearcher, pgvector_storage

        return PgvectorSearcher(pgvector_storage(session_settings(session)), gallery)
    if gallery.vector_storage == MILVUS:
        from app.vectors.milvus.storage import MilvusSearcher, milvus_storage

        return MilvusSearcher(milvus_storage(session_settings(session)), gallery)
    return None


def session_settings(session: Session) -> Settings:
    return session.info.get("settings") or get_settings()


def vectors_dir(session: Session) -> Path:
    return session_settings(session).data_dir / "vectors"
