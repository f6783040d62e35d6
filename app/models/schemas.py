"""HTTP shapes of trained models."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.core.schemas import Matrix, ModalityName, Page, StrictModel


class ModelOut(BaseModel):
    id: str
    kind: str = Field(description="backbone (compatible with an old space) or continual")
    method: str
    upgrade_id: str | None
    parent_id: str | None
    root_id: str
    gallery_id: str | None = Field(description="the gallery it was trained against")
    space: dict[str, Any] | None = Field(
        description="backbone: the old space it searches (model_name, dim, lift)"
    )
    modalities: list[str]
    input_dims: dict[str, int]
    output_dim: int
    curv: float
    rotation_since_parent: list[list[float]] | None
    artifact_sha256: str
    artifact_bytes: int
    embedder_id: str | None = Field(
        default=None, description="the embedder its two-stage searches use (PATCH to set)"
    )
    created_at: datetime


class ModelPatch(StrictModel):
    """What a model's owner may change: the embedder its two-stage searches use (null clears
    it)."""

    embedder_id: str | None = Field(min_length=1, max_length=40)


class ModelList(Page):
    items: list[ModelOut]


class EmbedRequest(StrictModel):
    """``features``: the NEW backbone's features, the model's inputs. (Old-space ``vectors`` are
    never embedded: galleries store them and search takes them as they are.)"""

    features: Matrix = Field(min_length=1, description="the new backbone's features (N×input_dim)")
    modality: ModalityName | None = None


class EmbedResponse(BaseModel):
    modality: str
    embeddings: list[list[float]] = Field(description="space components on the hyperboloid")
    uncertainty: list[float] = Field(description="1 − tanh(√c·d(o, x)); near the origin = vague")


class ModelCascade(BaseModel):
    reembedded_items: int = Field(description="items re-embedded for the model, deleted with it")
    by_gallery: dict[str, int] = Field(description="of them, per gallery")


class ModelDeleted(BaseModel):
    """``DELETE /v1/models/{id}?cascade=true``: what went with the model."""

    id: str
    cascaded: ModelCascade
