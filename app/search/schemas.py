"""HTTP shapes of gallery search."""

from __future__ import annotations

from pydantic import BaseModel, Field

from app.core.schemas import Matrix, ModalityName, StrictModel

NPY_MEDIA_TYPE = "application/x-npy"


class SearchRequest(StrictModel):
    """Without ``model_id``: vectors in the gallery's own space. With ``model_id``: that model's
    input features; the service embeds them and maps them into the gallery's frame."""

    vectors: Matrix = Field(min_length=1)
    k: int = Field(default=10, ge=1, description="neighbours per query (≤ the configured max_k)")
    model_id: str | None = Field(default=None, min_length=1, max_length=40)
    modality: ModalityName | None = None


class Neighbour(BaseModel):
    id: str
    distance: float = Field(description="Lorentz (hyperbolic) distance, exact in float64")
    label: str | None = None


class SearchResponse(BaseModel):
    results: list[list[Neighbour]]
