"""Upgrade jobs: the row is the truth for status and progress; queues are only transport."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, utcnow

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)


class UpgradeJob(Base):
    __tablename__ = "upgrade_jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    method: Mapped[str] = mapped_column(String(32))
    dataset_id: Mapped[str | None] = mapped_column(
        ForeignKey("datasets.id", ondelete="SET NULL"), index=True
    )
    gallery_id: Mapped[str | None] = mapped_column(
        ForeignKey("galleries.id", ondelete="SET NULL"), index=True
    )
    base_model_id: Mapped[str | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    seed: Mapped[int] = mapped_column(default=0)
    eval_fraction: Mapped[float] = mapped_column(default=0.2)
    status: Mapped[str] = mapped_column(String(16), default=QUEUED, index=True)
    progress: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    model_id: Mapped[str | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"))
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    attempts: Mapped[int] = mapped_column(default=0)
    worker: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
