"""HTTP for re-embed jobs (issue 43, item 6): 202 + Location on create. A re-embed job is a job
like an upgrade (method `reembed`): `GET /v1/upgrades/{id}` reads it, `POST
/v1/upgrades/{id}/cancel` stops it within one batch."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import select

from app.api.deps import IdempotencyDep, SessionDep, StateDep, TenantDep
from app.core.idempotency import StoredResponse, create_once, stored_json
from app.core.pagination import paginate
from app.core.schemas import LimitQuery, PageTokenQuery
from app.galleries.service import get_gallery
from app.jobs.models import UpgradeJob
from app.migration import reembed_job
from app.migration.schemas import ReembedCreate
from app.upgrades.schemas import UpgradeList, UpgradeOut
from app.upgrades.service import upgrade_out

router = APIRouter(prefix="/v1/galleries", tags=["migration"])


@router.post("/{gallery_id}/reembed", status_code=202, response_model=UpgradeOut)
def create_reembed(
    gallery_id: str,
    body: ReembedCreate,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    idempotency: IdempotencyDep,
) -> JSONResponse:
    """Queue a job that embeds the gallery's stored texts with the model's embedder and stores
    them as re-embedded items of the model, in the plan's order, up to `fraction` of the gallery:
    a migration with no client-side embedding. Poll the `Location`; resumable (what is stored
    stays; posting again embeds only what is missing)."""

    def create() -> StoredResponse:
        job = reembed_job.create_reembed(session, state.settings, tenant_id, gallery_id, body)
        session.flush()
        out = UpgradeOut.model_validate(upgrade_out(job))
        return StoredResponse(202, out.model_dump(mode="json"), f"/v1/upgrades/{job.id}")

    stored, created = create_once(session, tenant_id, idempotency, create)
    if created:
        # Enqueued only after the commit: a worker never sees a job the database does not have.
        state.runner.submit(stored.body["id"])
    return stored_json(stored)


@router.get("/{gallery_id}/reembed", response_model=UpgradeList)
def list_reembeds(
    gallery_id: str,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    page_token: PageTokenQuery = None,
    limit: LimitQuery = 50,
) -> dict:
    """The gallery's re-embed jobs, oldest first."""
    gallery = get_gallery(session, tenant_id, gallery_id)
    rows, next_token = paginate(
        session,
        select(UpgradeJob).where(
            UpgradeJob.tenant_id == tenant_id,
            UpgradeJob.gallery_id == gallery.id,
            UpgradeJob.method == reembed_job.METHOD,
        ),
        UpgradeJob.id,
        page_token,
        min(limit, state.settings.max_page_size),
    )
    stale_after = state.settings.job_stale_after_s
    return {"items": [upgrade_out(j, stale_after) for j in rows], "next_page_token": next_token}
