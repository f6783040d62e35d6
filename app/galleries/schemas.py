"""HTTP shapes of galleries and their vectors."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from app.core.schemas import Matrix, ModalityName, Name, Page, StrictModel, Text


class GalleryCreate(StrictModel):
    """External gallery: ``name``, ``dim``, ``model_name``, ``metric``. Model-bound gallery:
    ``name``, ``model_id`` (a model this service trained) and ``modality`` when it has several."""

    name: Name
    dim: int | None = Field(default=None, ge=1, description="external: the vectors' dimension")
    model_name: Text | None = Field(
        default=None, min_length=1, max_length=256, description="external: the old model's name"
    )
    metric: Literal["cosine", "dot"] | None = Field(default=None, description="external")
    model_id: str | None = Field(default=None, min_length=1, max_length=40)
    modality: ModalityName | None = None
    lift_scale: float | None = Field(
        default=None, gt=0, le=64, description="external: radius of lifted unit vectors"
    )
    curv: float | None = Field(default=None, gt=0, le=100, description="external: curvature −c")
    index: Literal["flat", "ivf", "hnsw"] | None = Field(
        default=None, description="FAISS structure; flat is exact"
    )
    index_params: dict[str, int] | None = Field(
        default=None, description="ivf: nlist, nprobe; hnsw: m, ef_construction, ef_search"
    )

    @model_validator(mode="after")
    def _one_kind(self) -> GalleryCreate:
        external = {"dim": self.dim, "model_name": self.model_name, "metric": self.metric}
        if self.model_id is None:
            missing = [k for k, v in external.items() if v is None]
            if missing:
                raise ValueError(
                    f"an external gallery needs {missing} (or give model_id for a model-bound one)"
                )
            if self.modality is not None:
                raise ValueError("modality applies to model-bound galleries only")
        else:
            given = [k for k, v in external.items() if v is not None]
            given += [k for k in ("lift_scale", "curv") if getattr(self, k) is not None]
            if given:
                raise ValueError(
                    f"a model-bound gallery takes its space from the model: drop {given}"
                )
        return self


class LiftOut(BaseModel):
    curv: float
    scale: float
    metric: str


class IndexOut(BaseModel):
    kind: str
    params: dict[str, int]


class GalleryOut(BaseModel):
    id: str
    name: str
    kind: Literal["external", "model"]
    dim: int = Field(description="dimension of uploaded vectors (model-bound: the model output)")
    model_name: str | None
    metric: str | None
    lift: LiftOut | None
    model_id: str | None
    modality: str | None
    input_dim: int | None = Field(
        default=None, description="model-bound: dimension of the features to upload"
    )
    index: IndexOut
    count: int
    created_at: datetime
    updated_at: datetime


class GalleryList(Page):
    items: list[GalleryOut]


class VectorsUpsert(StrictModel):
    """Upsert by id, all or nothing. An upsert replaces the whole item (label, metadata)."""

    ids: list[str] = Field(min_length=1)
    vectors: Matrix | None = Field(default=None, description="external galleries")
    features: Matrix | None = Field(default=None, description="model-bound galleries")
    labels: list[str] | None = None
    metadata: list[dict[str, Any] | None] | None = None


class VectorsDelete(StrictModel):
    ids: list[str] = Field(min_length=1)
    missing_ok: bool = Field(default=False, description="ignore ids the gallery does not hold")


class VectorsOut(BaseModel):
    """Stored rows in the order asked for, in the shape an upsert takes (it can be sent back)."""

    ids: list[str]
    vectors: list[list[float]] = Field(
        description="as stored: the uploaded old-space vectors (external galleries, float32) or "
        "the model's space components (model-bound galleries)"
    )
    labels: list[str | None]
    metadata: list[dict[str, Any] | None]


class UpsertResult(BaseModel):
    upserted: int
    count: int


class DeleteResult(BaseModel):
    deleted: int
    count: int


VECTORS_MULTIPART = {
    "type": "object",
    "required": ["ids"],
    "properties": {
        "ids": {"type": "string", "format": "binary", "description": ".npy of strings"},
        "vectors": {"type": "string", "format": "binary", "description": ".npy float N×D"},
        "features": {"type": "string", "format": "binary", "description": ".npy float N×D"},
        "labels": {"type": "string", "format": "binary", "description": ".npy of strings"},
        "metadata": {"type": "string", "description": "JSON array of objects"},
    },
}
