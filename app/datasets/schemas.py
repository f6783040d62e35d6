"""HTTP shapes of datasets (new-backbone features for training upgrades)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, field_validator

from app.core.schemas import Matrix, ModalityName, Name, Page, StrictModel
from app.ml.models import DEFAULT_MODALITY


class DatasetCreate(StrictModel):
    name: Name
    gallery_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=40,
        description="item ids are this gallery's ids; the old embeddings come from it",
    )
    modalities: list[ModalityName] = Field(
        default_factory=lambda: [DEFAULT_MODALITY], min_length=1, max_length=8
    )

    @field_validator("modalities")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("modalities must be distinct")
        return value


class DatasetOut(BaseModel):
    id: str
    name: str
    gallery_id: str | None
    modalities: list[str]
    dims: dict[str, int] = Field(description="feature dimension per modality (set by uploads)")
    count: int
    created_at: datetime


class DatasetList(Page):
    items: list[DatasetOut]


class ItemsUpload(StrictModel):
    """``features`` for a one-modality dataset, or ``modalities`` with every modality's rows
    (paired: row i of each is item ``ids[i]``). Upsert by id, all or nothing."""

    ids: list[str] = Field(min_length=1)
    features: Matrix | None = None
    modalities: dict[str, Matrix] | None = None
    labels: list[str] | None = None


class ItemsResult(BaseModel):
    upserted: int
    count: int


ITEMS_MULTIPART = {
    "type": "object",
    "required": ["ids"],
    "properties": {
        "ids": {"type": "string", "format": "binary", "description": ".npy of strings"},
        "features": {"type": "string", "format": "binary", "description": ".npy float N×D"},
        "labels": {"type": "string", "format": "binary", "description": ".npy of strings"},
    },
    "description": "several modalities: one part `modalities.<name>` (.npy N×D) per modality",
}
