"""Which storage holds a gallery's vectors (its ``vector_storage``), and where the storages keep
what lives outside the database; segment files and the Milvus connection follow the settings the
session was opened with."""

from __future__ import annotations

from pathlib import Path

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


def storage_for(session: Session, gallery: StoredGallery) -> VectorStorage:
    """The storage holding ``gallery``'s vectors (its ``vector_storage``); segment files and the
    Milvus connection follow the settings the session was opened with."""
    if gallery.vector_storage == "segments":
        from app.vectors.segments import segment_storage

        return segment_storage(vectors_dir(session))
    if gallery.vector_storage == MILVUS:
        from app.vectors.milvus_storage import milvus_storage

        return milvus_storage(session_settings(session))
    if gallery.vector_storage == QDRANT:
        from app.vectors.qdrant_storage import qdrant_storage

        return qdrant_storage(session_settings(session))
    if gallery.vector_storage == ATTACHED_MILVUS:
        from app.vectors.milvus_attached import milvus_attached_storage

        return milvus_attached_storage(session_settings(session))
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        from app.vectors.pgvector.storage import pgvector_storage

        return pgvector_storage(session_settings(session))
    from app.vectors.sql import SqlVectorStorage

    return SqlVectorStorage()


def session_settings(session: Session) -> Settings:
    return session.info.get("settings") or get_settings()


def vectors_dir(session: Session) -> Path:
    return session_settings(session).data_dir / "vectors"
