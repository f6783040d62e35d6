"""HTTP shapes of API keys: the secret is a field of the create answer only."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, StrictBool

from app.core.schemas import Page, StrictModel, Text


class KeyCreate(StrictModel):
    name: Text = Field(
        default="", max_length=128, description="a label to tell keys apart (not secret)"
    )
    # Strict: "yes", 1 or null granting (or not) admin rights is a client bug, not a boolean.
    admin: StrictBool = Field(
        default=False, description="whether the new key may create, list and revoke keys too"
    )


class KeyOut(BaseModel):
    id: str
    prefix: str = Field(description="the key's first characters, to recognise it; not usable")
    name: str
    admin: bool = Field(description="an admin key also manages the tenant's keys")
    created_at: datetime
    revoked_at: datetime | None = Field(description="set once revoked; the key is then refused")


class KeyCreated(KeyOut):
    key: str = Field(
        description="the API key itself, shown in this answer only (the server keeps its SHA-256 "
        "digest): store it now"
    )


class KeyList(Page):
    items: list[KeyOut]
