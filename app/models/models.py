"""Trained models: the artifact file (checksummed), lineage and the frame they embed into."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, utcnow


class TrainedModel(Base):
    """``kind`` is ``backbone`` (compatible with the old Euclidean space ``space_model_name`` /
    ``space_dim`` under ``lift``) or ``continual`` (a version in a lineage rooted at ``root_id``;
    ``rotation`` is the accumulated shared rotation since ``parent_id``)."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String(32))
    upgrade_id: Mapped[str | None] = mapped_column(String(40))
    parent_id: Mapped[str | None] = mapped_column(
        ForeignKey("models.id", ondelete="RESTRICT"), index=True
    )
    root_id: Mapped[str] = mapped_column(String(40), index=True)
    depth: Mapped[int] = mapped_column(default=0)
    # The gallery it was trained against (informational: the compatibility is with the space).
    trained_on_gallery_id: Mapped[str | None] = mapped_column(String(40))
    space_model_name: Mapped[str | None] = mapped_column(String(256))
    space_dim: Mapped[int | None]
    lift: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    modalities: Mapped[list[str]] = mapped_column(JSON)
    input_dims: Mapped[dict[str, Any]] = mapped_column(JSON)
    output_dim: Mapped[int]
    curv: Mapped[float]
    # float64 d×d, C order; None for backbone models and lineage roots.
    rotation: Mapped[bytes | None] = mapped_column(LargeBinary)
    artifact_path: Mapped[str] = mapped_column(String(512))
    artifact_sha256: Mapped[str] = mapped_column(String(64))
    artifact_bytes: Mapped[int]
    # Continual trainers' state (what the next task continues from), checksummed like the model.
    state_path: Mapped[str | None] = mapped_column(String(512))
    state_sha256: Mapped[str | None] = mapped_column(String(64))
    # The new backbone's embedding endpoint (``app.embedders``): what a two-stage search embeds
    # query texts and candidates with. None: searches send features and no candidate is
    # embedded lazily.
    embedder_id: Mapped[str | None] = mapped_column(ForeignKey("embedders.id"), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
