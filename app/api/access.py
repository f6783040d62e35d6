"""HTTP for a gallery's access counts (thin: parsing and status codes only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from starlette.concurrency import run_in_threadpool

from app.api.deps import SessionDep, StateDep, TenantDep
from app.core.errors import invalid
from app.core.limits import ArrayLimits
from app.core.schemas import LimitQuery, openapi_body
from app.core.uploads import read_body
from app.galleries import service
from app.migration import access
from app.migration.schemas import (
    ACCESS_MULTIPART,
    AccessOrderQuery,
    AccessPage,
    AccessResult,
    AccessTokenQuery,
    AccessUpload,
)

router = APIRouter(prefix="/v1/galleries", tags=["galleries"])


@router.post(
    "/{gallery_id}/access",
    response_model=AccessResult,
    openapi_extra=openapi_body(AccessUpload, multipart=ACCESS_MULTIPART),
)
async def add_access_counts(
    gallery_id: str,
    request: Request,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="retrying the same counts with the same key replays the first answer "
            "and counts nothing again",
            max_length=255,
        ),
    ] = None,
) -> dict:
    """Add access counts (what users opened or clicked) to the gallery's items, all or nothing:
    JSON `{"ids": [...], "counts": [...]}`, or multipart `.npy` parts `ids` (strings) and
    `counts` (integers). A repeated id is summed; an id the gallery does not hold is a 422
    naming it, and nothing is counted. The backfill plan ranks by these counts."""
    # The body first, with no database connection held while it arrives (a slow client must
    # not hold one); then the lookup and the write, in the thread pool.
    fields = await read_body(
        request,
        AccessUpload,
        array_fields=set(),
        string_fields={"ids"},
        json_fields=set(),
        limits=ArrayLimits.of(state.settings),
        int_fields={"counts"},
    )
    for name in ("ids", "counts"):
        if name not in fields:
            raise invalid(name, "required")
    gallery = await run_in_threadpool(service.get_gallery, session, tenant_id, gallery_id)
    return await run_in_threadpool(
        access.add_counts,
        session,
        state.settings,
        gallery,
        fields["ids"],
        fields["counts"],
        idempotency_key,
    )


@router.get("/{gallery_id}/access", response_model=AccessPage, response_model_exclude_none=True)
def list_access_counts(
    gallery_id: str,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    order: AccessOrderQuery = "id",
    page_token: AccessTokenQuery = None,
    limit: LimitQuery = 50,
) -> dict:
    """The gallery's access counts, a page at a time: by item id, or by count (largest first)."""
    gallery = service.get_gallery(session, tenant_id, gallery_id)
    items, next_token = access.page(
        session, gallery.id, order, page_token, min(limit, state.settings.max_page_size)
    )
    counted_items, total = access.counted(session, gallery.id)
    return {
        "items": items,
        "next_page_token": next_token,
        "counted_items": counted_items,
        "total": total,
    }
