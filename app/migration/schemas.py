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
