"""HTTP shapes of galleries and their vectors."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from app.core.schemas import Matrix, ModalityName, Name, Page, StrictModel, Text
from app.vectors.pgvector.source import DEFAULT_EF_SEARCH


class QdrantSourceIn(StrictModel):
    """A Qdrant collection to attach: read-only, its points are the gallery's items."""

    engine: Literal["qdrant"]
    url: str | None = Field(
        default=None, min_length=1, max_length=2048, pattern=r"^https?://", description="server"
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="an embedded (local-mode) folder under the server's Qdrant root",
    )
    collection: str = Field(min_length=1, max_length=255)
    vector: str | None = Field(
        default=None, min_length=1, max_length=255, description="named vector; default unnamed"
    )
    api_key_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="the server's environment variable holding the API key",
    )
    text_field: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="the payload key holding each item's document text, what a two-stage search and a "
        "re-embed job send to a model's embedder (checked on attach: at least one point must carry it, non-empty)",
    )

    @model_validator(mode="after")
    def _one_place(self) -> QdrantSourceIn:
        if (self.url is None) == (self.path is None):
            raise ValueError("give url (a Qdrant server) or path (an embedded folder), not both")
        if self.path is not None and self.api_key_env is not None:
            raise ValueError("api_key_env applies to a url only")
        return self


class MilvusSourceIn(StrictModel):
    """A Milvus collection to attach: read-only, its rows are the gallery's items (item ids: the
    primary key as a string)."""

    engine: Literal["milvus"]
    uri: str = Field(
        min_length=1,
        max_length=2048,
        description="a Milvus server (http(s)://host:19530) or a milvus-lite file (….db) under "
        "the server's Milvus attach root",
    )
    collection: str = Field(min_length=1, max_length=255)
    id_field: str = Field(
        min_length=1, max_length=255, description="the primary key (INT64 or VARCHAR)"
    )
    vector_field: str = Field(
        min_length=1, max_length=255, description="the FLOAT_VECTOR field, indexed for COSINE"
    )
    metric: str = Field(
        default="COSINE",
        min_length=1,
        max_length=32,
        description="the vector field's metric; attached galleries need COSINE",
    )
    token_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="the server's environment variable holding the token (user:password)",
    )
    text_field: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="the VARCHAR field holding each item's document text, what a two-stage search and a "
        "re-embed job send to a model's embedder (checked on attach: a VARCHAR field of the collection's schema)",
    )

    @model_validator(mode="after")
    def _token_for_a_server(self) -> MilvusSourceIn:
        if self.token_env is not None and not self.uri.startswith(("http://", "https://")):
            raise ValueError("token_env applies to a server uri only")
        return self


# A PostgreSQL name as the service accepts it (``app.vectors.pgvector.source.IDENTIFIER``):
# checked here for the 422, and again before any statement, where it is sent quoted.
PG_NAME = r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$"


class PgvectorSourceIn(StrictModel):
    """A PostgreSQL table with a pgvector column to attach: read-only, its rows with a vector
    are the gallery's items (item ids: the id column's values as strings)."""

    engine: Literal["pgvector"]
    dsn: str = Field(
        min_length=1,
        max_length=1024,
        description="the database: postgresql://user@host:5432/db or host=… port=… dbname=… "
        "user=…; it must name a database listed in NOBACKFILL_PGVECTOR_ALLOWED_DSNS, and carry "
        "no password",
    )
    table: str = Field(
        min_length=1,
        max_length=127,
        pattern=r"^[A-Za-z_][A-Za-z0-9_$]{0,62}(\.[A-Za-z_][A-Za-z0-9_$]{0,62})?$",
        description="the table, or schema.table (default schema public)",
    )
    id_column: str = Field(
        pattern=PG_NAME,
        description="an integer or text column, the primary key or with a unique index",
    )
    vector_column: str = Field(pattern=PG_NAME, description="a vector(D) or halfvec(D) column")
    distance: Literal["cosine", "inner_product", "l2"] = Field(
        default="cosine",
        description="how the owner searches the table; inner_product and l2 only on unit-length "
        "rows (checked), where they rank as cosine, the attached galleries' metric",
    )
    password_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Z_][A-Z0-9_]*$",
        description="the server's environment variable holding the password",
    )
    text_field: str | None = Field(
        default=None,
        pattern=PG_NAME,
        description="a text column holding each item's document text (checked on attach)",
    )
    migration_hnsw: bool = Field(
        default=False,
        description="an in-place migration adds a vector(D) column per model to the table; "
        "true: each such column also gets an HNSW index with the operator class of `distance` "
        "(for your own searches of it: the service's are exact and use no index)",
    )
    search: Literal["exact", "hnsw"] = Field(
        default="exact",
        description="exact: every search scans the table (the exact top k, whatever index the "
        "table has); hnsw: searches of the vector column go through its HNSW index with the "
        "operator class of `distance` (checked on attach), approximate as your own index "
        "searches are, re-ranked exactly among what the index returns",
    )
    ef_search: int = Field(
        default=DEFAULT_EF_SEARCH,
        ge=1,
        le=1000,
        description="hnsw: the index's hnsw.ef_search for the service's searches (default: "
        "pgvector's own; raised to k plus room for ties when smaller)",
    )


class GalleryCreate(StrictModel):
    """External gallery: ``name``, ``dim``, ``model_name``, ``metric``. Model-bound gallery:
    ``name``, ``model_id`` (a model this service trained) and ``modality`` when it has several.
    Attached gallery: ``name`` and ``source`` (dimension and metric come from the collection)."""

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
    source: (
        Annotated[QdrantSourceIn | MilvusSourceIn | PgvectorSourceIn, Field(discriminator="engine")]
        | None
    ) = Field(
        default=None,
        description="attach an existing collection (Qdrant or Milvus) or pgvector table "
        "instead of storing vectors",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> GalleryCreate:
        if self.source is not None:
            given = [
                k for k in ("dim", "metric", "model_id", "modality") if getattr(self, k) is not None
            ]
            if given:
                raise ValueError(
                    f"an attached gallery takes its space from the collection: drop {given}"
                )
            return self
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


class ExpectedStep(BaseModel):
    fraction: float
    value: float | None


class ExpectedQuality(BaseModel):
    search: Literal["transition", "mixed"] = Field(
        description="transition: both models' query vectors; mixed: features alone (bridged)"
    )
    view: str
    metric: str
    now: float = Field(description="expected figure at the share re-embedded now")
    next: ExpectedStep = Field(description="one plan step (a tenth of the gallery) further")


class ReembedProgress(BaseModel):
    model_id: str
    reembedded: int = Field(description="items holding this model's new-backbone features")
    total: int = Field(description="items in the gallery")
    fraction: float
    traffic_covered: float | None = Field(
        default=None,
        description="share of the gallery's access counts on re-embedded items (null: no counts)",
    )
    expected: ExpectedQuality | None = Field(
        default=None,
        description="expected search quality on the upgrade's held-out queries, from the "
        "model's backfill fit (null until a plan or mixed search has stored one)",
    )


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
    source: dict[str, Any] | None = Field(
        default=None,
        description="attached galleries: the Qdrant or Milvus collection read (never the key or "
        "token itself)",
    )
    reembedded: list[ReembedProgress] = Field(
        default_factory=list, description="per model: items re-embedded by its new backbone"
    )
    created_at: datetime
    updated_at: datetime


class GalleryList(Page):
    items: list[GalleryOut]


class VectorsUpsert(StrictModel):
    """Upsert by id, all or nothing. An upsert replaces the whole item (label, metadata).

    With ``model_id`` (a backbone model trained for this gallery's space): ``ids`` of items the
    gallery already holds and ``features``, the new backbone's features of each (that model's
    inputs). They are stored beside the old vectors, which stay; searches with that ``model_id``
    then score these items natively (partial backfill). Nothing else may be given."""

    ids: list[str] = Field(min_length=1)
    vectors: Matrix | None = Field(default=None, description="external galleries")
    features: Matrix | None = Field(
        default=None, description="model-bound galleries; with model_id: re-embedded items"
    )
    model_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=40,
        description="store the new backbone's features of existing items for this model",
    )
    labels: list[str] | None = None
    metadata: list[dict[str, Any] | None] | None = None
    texts: list[str | None] | None = Field(
        default=None,
        description="each item's document text (null: none), what a two-stage search sends to "
        "a model's embedder for items it has no new vector of; replaced with the item",
    )


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
    reembedded: int | None = Field(
        default=None, description="with model_id: the gallery's items re-embedded for it"
    )
    skipped: list[str] | None = Field(
        default=None,
        description="with model_id, on an attached Qdrant collection: ids whose point is no "
        "longer in the collection (deleted since the plan listed it); nothing was written for "
        "them",
    )


class BackfillPlanRequest(StrictModel):
    """``fraction``: the share of the gallery to have re-embedded once the listed items are
    (items already re-embedded count toward it); or ``count``: how many more items to list."""

    model_id: str = Field(min_length=1, max_length=40)
    fraction: float | None = Field(default=None, ge=0, le=1)
    count: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_size(self) -> BackfillPlanRequest:
        if (self.fraction is None) == (self.count is None):
            raise ValueError("give fraction or count (one of them)")
        return self


class ExpectedPoint(BaseModel):
    fraction: float = Field(description="share of the gallery re-embedded")
    metric: str = Field(description="recall@k of the held-out queries (see `view`)")
    value: float


class TrafficCandidate(BaseModel):
    name: str
    returned_weight: float
    neighbourhood_weight: float
    covered_future: float = Field(
        description="mean share of the held-out half of the clicks its top items hold"
    )
    gain_min: float = Field(description="its smallest gain over the counts alone on a split")


class TrafficModel(BaseModel):
    chosen: str = Field(description="the traffic estimate the order used")
    splits: int = Field(description="random halvings of the clicks it was validated on (0: none)")
    margin: float | None = Field(
        default=None, description="the noise a candidate's mean gain had to exceed"
    )
    rule: str
    candidates: list[TrafficCandidate]
    note: str | None = None


class PlanAccess(BaseModel):
    counted_items: int = Field(description="items of the gallery with an access count")
    total: int = Field(description="the sum of the gallery's access counts")
    covered_after: float = Field(
        description="share of the counted accesses on items re-embedded once the listed are"
    )
    model: TrafficModel | None = Field(
        default=None,
        description="which combination of the access counts, the search-returned tally and "
        "the neighbourhood of clicked items estimated the traffic, and its validation",
    )


class PlanReturned(BaseModel):
    items: int = Field(description="items the service's searches have returned")
    weight: float = Field(description="the tally's total (1 / rank per returned hit)")
    used: bool = Field(description="whether the order used it")
    why: str


class BackfillPlanOut(BaseModel):
    model_id: str
    ids: list[str] = Field(description="items to re-embed next, most valuable first")
    estimator: str = Field(description="expected_gain (learned) or uncertainty")
    signals: list[str] = Field(
        default_factory=list,
        description="what the order used: access_counts (the gallery's, as expected traffic), "
        "search_returned and neighbourhood (where validation picked them), and the learned "
        "estimator (expected_gain or uncertainty)",
    )
    access: PlanAccess | None = Field(
        default=None, description="the gallery's access counts, when it has any"
    )
    search_returned: PlanReturned | None = Field(
        default=None,
        description="the service's own tally of what its searches returned (a weaker signal "
        "than access counts), when it has any; off with NOBACKFILL_SEARCH_RETURNED_TALLY=false",
    )
    warning: str | None = Field(
        default=None,
        description="set when the plan's cross-fitted validation finds its learned order no "
        "better than random (`validation.vs_random`)",
    )
    expected_note: str | None = Field(
        default=None,
        description="why `expected` falls somewhere as the share grows (null: it never does)",
    )
    view: str = Field(
        description="query: the upgrade's held-out logged queries; instance: held-out items' "
        "own new features as queries"
    )
    reembedded: int
    total: int
    fraction_after: float = Field(description="share re-embedded once the listed items are")
    expected: list[ExpectedPoint] = Field(
        description="quality against the share re-embedded in this order, simulated on the "
        "upgrade's held-out data"
    )
    validation: dict[str, Any]
    transition_expected: list[ExpectedPoint] | None = Field(
        default=None,
        description="a transition search's quality (both models' query vectors) against a "
        "random share re-embedded, simulated on the upgrade's held-out queries; null without "
        "the old model's vectors of those queries",
    )
    calibration: dict[str, Any] = Field(
        default_factory=dict,
        description="how mixed and transition searches merge the two lists: `served` (tail: "
        "the per-query reference calibration alone; relevance: mapped to P(relevant) where "
        "fitted) and, per list (native, bridged, old), the relevant items its map was fitted "
        "on (null: no map, the merge uses the calibrated score)",
    )


class GalleryCascade(BaseModel):
    reembedded_items: int = Field(description="re-embedded items deleted with the gallery")
    by_model: dict[str, int] = Field(description="of them, per model they were re-embedded for")


class GalleryDeleted(BaseModel):
    """``DELETE /v1/galleries/{id}?cascade=true``: what went with the gallery."""

    id: str
    cascaded: GalleryCascade


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
        "texts": {"type": "string", "format": "binary", "description": ".npy of strings"},
        "metadata": {"type": "string", "description": "JSON array of objects"},
        "model_id": {
            "type": "string",
            "description": "re-embedded items: the model id, as plain text or a JSON string",
        },
    },
}
