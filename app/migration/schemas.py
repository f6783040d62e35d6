"""HTTP shapes of access counts (``app.migration.access``)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Query
from pydantic import BaseModel, Field, StrictInt

from app.core.schemas import Page, StrictModel

# Strict: a JSON integer only; 2.0, true or "3" as a count is a client bug, not a number.
CountValue = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]


class AccessUpload(StrictModel):
    """Counts to add to the gallery's items (what users opened or clicked, from your own logs):
    ``counts[n]`` for ``ids[n]``. Every id must be an item of the gallery (422 naming the
    unknown ones, nothing counted); an id given more than once is summed."""

    ids: list[str] = Field(min_length=1)
    counts: list[CountValue] = Field(description="non-negative integers, one per id")


class AccessResult(BaseModel):
    updated: int = Field(description="distinct items given a positive count by this upload")
    added: int = Field(description="the sum of this upload's counts")


class AccessItem(BaseModel):
    id: str
    count: int


class AccessPage(Page):
    items: list[AccessItem]
    counted_items: int = Field(description="items of the gallery with a count")
    total: int = Field(description="the sum of the gallery's counts")


AccessOrderQuery = Annotated[
    Literal["id", "count"],
    Query(description="id (ascending) or count (largest first, ties by id)"),
]
# A cursor holds an item id (up to 256 characters, base64 and JSON around it).
AccessTokenQuery = Annotated[
    str | None, Query(max_length=1400, description="next_page_token of the previous page")
]

ACCESS_MULTIPART = {
    "type": "object",
    "required": ["ids", "counts"],
    "properties": {
        "ids": {"type": "string", "format": "binary", "description": ".npy of strings"},
        "counts": {
            "type": "string",
            "format": "binary",
            "description": ".npy of non-negative integers (1-D, any integer dtype)",
        },
    },
}


class ReembedCreate(StrictModel):
    """A job that embeds the gallery's stored texts with the model's embedder and stores them as
    re-embedded items of the model (``app.migration.reembed_job``)."""

    model_id: str = Field(description="a backbone model of this gallery's space, with an embedder")
    fraction: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="the share of the gallery re-embedded when the job ends (items already "
        "re-embedded count); 1: the whole migration",
    )
    order: Literal["plan", "gallery"] = Field(
        default="plan",
        description="`plan`: the backfill plan's order (traffic × expected gain; the gallery's "
        "order when the plan cannot be fitted, said in the report); `gallery`: the gallery's "
        "own order",
    )
    batch_size: int | None = Field(
        default=None,
        ge=1,
        description="texts per embedder call (at most the embedder's `max_batch`, its default)",
    )
    items_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="the job's rate limit (default and maximum: the server's "
        "NOBACKFILL_REEMBED_MAX_ITEMS_PER_MINUTE)",
    )
