"""HTTP for a tenant's API keys (admin keys only): create, list, revoke."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status

from app.api.deps import AdminTenantDep, SessionDep, StateDep
from app.auth import keys
from app.auth.schemas import KeyCreate, KeyCreated, KeyList
from app.core.schemas import LimitQuery, PageTokenQuery

router = APIRouter(prefix="/v1/keys", tags=["keys"])

ADMIN_ONLY: dict[int | str, dict[str, Any]] = {
    403: {"description": "The API key is not an admin key: only admin keys manage keys"}
}
IncludeRevokedQuery = Annotated[
    bool, Query(description="list revoked keys too (with their revoked_at)")
]


@router.post("", status_code=201, response_model=KeyCreated, responses=ADMIN_ONLY)
def create_key(
    body: KeyCreate,
    response: Response,
    state: StateDep,
    session: SessionDep,
    tenant_id: AdminTenantDep,
) -> dict[str, Any]:
    """A new key of this tenant. The key itself is in this answer only: the server keeps its
    SHA-256 digest. No `Idempotency-Key`: replaying the answer would mean storing the key."""
    row, key = keys.create_key(
        session, tenant_id, body.name, body.admin, state.settings.max_keys_per_tenant
    )
    # A secret: no cache between here and the client may keep a copy.
    response.headers["Cache-Control"] = "no-store"
    return {**keys.key_out(row), "key": key}


@router.get("", response_model=KeyList, responses=ADMIN_ONLY)
def list_keys(
    state: StateDep,
    session: SessionDep,
    tenant_id: AdminTenantDep,
    page_token: PageTokenQuery = None,
    limit: LimitQuery = 50,
    include_revoked: IncludeRevokedQuery = False,
) -> dict[str, Any]:
    """This tenant's keys, oldest first: prefixes and names, never the keys."""
    rows, next_token = keys.list_keys(
        session,
        tenant_id,
        include_revoked=include_revoked,
        page_token=page_token,
        limit=limit,
        max_page_size=state.settings.max_page_size,
    )
    return {"items": [keys.key_out(k) for k in rows], "next_page_token": next_token}


@router.delete(
    "/{key_id}",
    status_code=204,
    responses={
        **ADMIN_ONLY,
        409: {"description": "The key is this tenant's last active admin key"},
    },
)
def revoke_key(key_id: str, session: SessionDep, tenant_id: AdminTenantDep) -> Response:
    """Revoke a key: its next request answers 401. Revoking a revoked key changes nothing; the
    tenant's last active admin key cannot be revoked (409), so a tenant never locks itself out."""
    keys.revoke_key(session, tenant_id, key_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
