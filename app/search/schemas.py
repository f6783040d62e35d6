"""HTTP shapes of gallery search."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from app.core.schemas import Matrix, ModalityName, StrictModel

NPY_MEDIA_TYPE = "application/x-npy"

DISTANCE_TEXT = (
    "Lorentz (hyperbolic) geodesic distance d(q, x) = acosh(−c⟨q,x⟩_L)/√c between the query's "
    "point q and the stored point x on the hyperboloid of curvature −c (the gallery's "
    "`lift.curv`, or its model's `curv`), ⟨q,x⟩_L = q·x − q₀x₀, x₀ = √(1/c + ‖x‖²); exact in "
    "float64; smaller is nearer. Cosine galleries lift a stored vector f to x = exp₀(s·f/‖f‖) "
    "(s = `lift.scale`), so every stored point has ‖x‖ = R = sinh(√c·s)/√c and "
    "cos(q, f) = (q₀x₀ − cosh(√c·d)/c) / (‖q‖·R); for a query given as old-space `vectors` "
    "(‖q‖ = R as well) this is cos = 1 − (cosh(√c·d) − 1)/sinh²(√c·s), so a cosine threshold t "
    "is the distance threshold d ≤ acosh(1 + (1 − t)·sinh²(√c·s))/√c."
)
SCORE_TEXT = (
    "Larger is nearer, and ranks exactly like `distance`. Cosine galleries: the cosine "
    "similarity between the query's point and the stored vector (the same direction as the "
    "uploaded vector), in [−1, 1]. Other galleries (dot, model-bound): the Lorentz inner "
    "product ⟨q,x⟩_L = −cosh(√c·d)/c ≤ −1/c, what an inner-product search of the lifted "
    "vectors computes (see GET /v1/models/{id}/export)."
)


class SearchRequest(StrictModel):
    """Without ``model_id``: ``vectors`` of the gallery's own (old) space. With ``model_id``:
    ``features`` of the new backbone, that model's inputs; the service embeds them and maps them
    into the gallery's frame (``vectors`` together with ``model_id`` is still read as features,
    the former spelling).

    **Transition search** (a migration in progress, the old model still running): ``model_id``,
    ``features`` and ``old_vectors``, the old model's vectors of the same queries (same rows).
    Items re-embedded for the model are scored by ``features`` natively, every other item by
    ``old_vectors`` in the gallery's own space; one merged list, each hit's ``space`` says which.
    With nothing re-embedded it is exactly the old model's search, with everything exactly a
    reindex. ``old_vectors`` without ``model_id`` is a plain old-space search."""

    vectors: Matrix | None = Field(
        default=None, min_length=1, description="old-space vectors (what the gallery stores)"
    )
    features: Matrix | None = Field(
        default=None, min_length=1, description="with model_id: the new backbone's features"
    )
    old_vectors: Matrix | None = Field(
        default=None,
        min_length=1,
        description="the old model's vectors of the same queries: with model_id and features, "
        "a transition search (items not re-embedded are scored by these in the old space)",
    )
    texts: list[str] | None = Field(
        default=None,
        min_length=1,
        description="with model_id and rerank: the queries as text, embedded by the model's "
        "embedder (with its query prefix) instead of sending features",
    )
    k: int = Field(default=10, ge=1, description="neighbours per query (≤ the configured max_k)")
    model_id: str | None = Field(default=None, min_length=1, max_length=40)
    modality: ModalityName | None = None
    rerank: dict[str, int] | None = Field(
        default=None,
        description="two-stage search: candidates from the gallery's own index (by old_vectors "
        "when given, else by the bridged query), ranked by the new model: `{}` for the default "
        'depth, `{"depth": N}` for N candidates per query',
        json_schema_extra={"properties": {"depth": {"type": "integer", "minimum": 1}}},
    )

    @field_validator("rerank")
    @classmethod
    def _rerank(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is None:
            return None
        extra = sorted(set(value) - {"depth"})
        if extra:
            raise ValueError(f"unknown key {extra[0]!r}: only depth")
        if "depth" in value and value["depth"] < 1:
            raise ValueError("depth must be ≥ 1")
        return value


MIXED_TEXT = (
    "Only in a search with `model_id` of a gallery holding items re-embedded for that model "
    "(partial backfill), and in every transition search (`old_vectors` with `model_id`): `new` — "
    "the item was scored natively, by the cosine of the query's and the item's new-backbone "
    "features (`distance` is their angle in radians); `old` — by the bridged query (a transition "
    "search: the query's `old_vectors`) against its old vector (`distance` as above). `score` is then the calibrated "
    "−ln of the estimated share of the gallery scoring above the item in its own space, which "
    "ranks both kinds in one order (larger is nearer). In a two-stage search (`rerank`): `new` "
    "— ranked by the new model's cosine (`score`; `distance` its angle in radians); `old` — a "
    "candidate with no new vector (no text, or nothing embedded), after every `new` one in the "
    "old index's order (`score` and `distance` as in a plain search)."
)


class Neighbour(BaseModel):
    id: str
    distance: float = Field(description=DISTANCE_TEXT)
    score: float = Field(description=SCORE_TEXT)
    label: str | None = None
    space: Literal["old", "new"] | None = Field(default=None, description=MIXED_TEXT)


class RerankOut(BaseModel):
    """How a two-stage search went."""

    depth: int = Field(description="candidates per query from the old index")
    candidates: int = Field(description="distinct candidates over the queries")
    embedded: int = Field(description="candidates this search embedded and stored for the model")
    scored_new: int = Field(description="distinct candidates ranked by the new model")
    fusion_weight: float = Field(
        default=0.0,
        description="weight of the old model's score in the ranking (with old_vectors on a "
        "cosine gallery: the one the model's upgrade fitted on half its held-out queries; "
        "0: the new model alone); `score` of a `new` hit is then the fused, standardised score",
    )
    degraded: str | None = Field(
        default=None,
        description="why the new model could not rank the candidates (the embedder down, slow, "
        "answering garbage, its circuit open): the results are then the single-stage search "
        "(transition with old_vectors, else bridged), also said by the header "
        "`X-Nobackfill-Degraded`",
    )


class SearchResponse(BaseModel):
    results: list[list[Neighbour]]
    rerank: RerankOut | None = None
    warning: str | None = Field(
        default=None,
        description="with model_id and features alone: the model's upgrade did not recommend "
        "the bridge (its held-out data did not show it beats the old model); also said by the "
        "header `X-Nobackfill-Warning`",
    )
