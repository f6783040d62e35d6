"""The per-model backfill fit of a partial re-embedding (the planner and the reference documents
of the mixed search)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, LargeBinary
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, utcnow


class BackfillFit(Base):
    """Fitted once per model from its upgrade's held-out data: the planner (``fit``, JSON) and
    the reference documents (``reference``: an .npz of their new features and old vectors)."""

    __tablename__ = "backfill_fits"

    model_id: Mapped[str] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    fit: Mapped[dict[str, Any]] = mapped_column(JSON)
    reference: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
