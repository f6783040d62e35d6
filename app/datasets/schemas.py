"""HTTP shapes of datasets (new-backbone features for training upgrades)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, field_validator

from app.core.schemas import Matrix, ModalityName, Name, Page, StrictModel
from app.ml.methods.models import DEFAULT_MODALITY


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


class QueryCounts(BaseModel):
    count: int = Field(description="logged queries")
    with_old_vectors: int = Field(description="queries with the old model's embedding")
    with_relevance: int = Field(description="queries with relevant gallery items")


class DatasetOut(BaseModel):
    id: str
    name: str
    gallery_id: str | None
    modalities: list[str]
    dims: dict[str, int] = Field(description="feature dimension per modality (set by uploads)")
    count: int
    queries: QueryCounts = Field(description="the query log (POST /v1/datasets/{id}/queries)")
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


class QueriesUpload(StrictModel):
    """Logged queries, upserted by id, all or nothing: row i of ``features`` (new backbone, the
    dataset's first-modality dimension), of ``old_vectors`` (the old model, the gallery's
    dimension) and ``relevant_ids[i]`` (gallery item ids) are query ``ids[i]``. Give
    ``old_vectors``, ``relevant_ids`` or both; a dataset's queries all have old vectors or none
    do."""

    ids: list[str] = Field(min_length=1)
    features: Matrix
    old_vectors: Matrix | None = None
    relevant_ids: list[list[str]] | None = Field(
        default=None,
        description="per query, the gallery items it is about (empty only with old_vectors)",
    )


class QueriesResult(BaseModel):
    upserted: int
    queries: QueryCounts


class QueriesDeleted(BaseModel):
    deleted: int


QUERIES_MULTIPART = {
    "type": "object",
    "required": ["ids", "features"],
    "properties": {
        "ids": {"type": "string", "format": "binary", "description": ".npy of strings"},
        "features": {"type": "string", "format": "binary", "description": ".npy float Q×D"},
        "old_vectors": {"type": "string", "format": "binary", "description": ".npy float Q×d"},
        "relevant_ids": {
            "type": "string",
            "description": "JSON: one array of gallery item ids per query",
        },
    },
}
