"""HTTP shapes of API keys: the secret is a field of the create answer only."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, StrictBool, field_validator

from app.core.schemas import Page, StrictModel, Text

# The server's own keys' names: a changed bootstrap key revokes the earlier keys so named, so a
# key created under one of them would be revoked by the next rotation.
RESERVED_KEY_NAMES = frozenset({"bootstrap", "local"})


class KeyCreate(StrictModel):
    name: Text = Field(
        default="",
        max_length=128,
        description="a label to tell keys apart (not secret; 'bootstrap' and 'local' are the "
        "server's own)",
    )
    # Strict: "yes", 1 or null granting (or not) admin rights is a client bug, not a boolean.
    admin: StrictBool = Field(
        default=False, description="whether the new key may create, list and revoke keys too"
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_KEY_NAMES:
            raise ValueError(f"{name!r} names the server's own key; choose another name")
        return name


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
