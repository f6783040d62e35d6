"""HTTP shapes of upgrade jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.core.schemas import Page, StrictModel


class UpgradeCreate(StrictModel):
    dataset_id: str = Field(min_length=1, max_length=40)
    method: str = Field(
        default="auto",
        min_length=1,
        max_length=32,
        description=(
            "see GET /v1/upgrades/methods; `auto` (backbone upgrades) trains the candidates and "
            "serves the best on validation for the objective"
        ),
    )
    objective: Literal["query", "class", "instance"] | None = Field(
        default=None,
        description=(
            "backbone upgrades: what the model must be good at. `query`: logged queries find "
            "their relevant items; `class`: same-label neighbours; `instance`: each item's own "
            "old vector. Default: `query` when queries carry relevance, else `class` with "
            "labels, else `instance`"
        ),
    )
    gallery_id: str | None = Field(
        default=None, min_length=1, max_length=40, description="backbone upgrades: the old gallery"
    )
    base_model_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=40,
        description="continual upgrades: the version to continue from (absent for the first task)",
    )
    params: dict[str, Any] | None = Field(default=None, description="trainer parameters")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    eval_fraction: float = Field(
        default=0.2, gt=0, lt=1, description="share of the dataset held out for the report"
    )


class UpgradeOut(BaseModel):
    id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    method: str
    dataset_id: str | None
    gallery_id: str | None
    base_model_id: str | None
    params: dict[str, Any]
    seed: int
    eval_fraction: float
    progress: dict[str, Any] = Field(description="epoch, epochs, loss, … (latest report)")
    model_id: str | None
    report: dict[str, Any] | None
    error: str | None
    attempts: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class UpgradeList(Page):
    items: list[UpgradeOut]


class MethodsOut(BaseModel):
    backbone: list[str]
    continual: list[str]
