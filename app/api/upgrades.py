"""HTTP for upgrade jobs: 202 + Location on create; the job resource reports status."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse

from app.api.deps import IdempotencyDep, SessionDep, StateDep, TenantDep
from app.core.errors import conflict
from app.core.idempotency import StoredResponse, create_once, stored_json
from app.core.schemas import LimitQuery, PageTokenQuery
from app.core.tenancy import tenant_page
from app.jobs.models import SUCCEEDED, UpgradeJob
from app.upgrades import service
from app.upgrades.report_html import render_report_html
from app.upgrades.schemas import MethodsOut, UpgradeCreate, UpgradeList, UpgradeOut

router = APIRouter(prefix="/v1/upgrades", tags=["upgrades"])


@router.post("", status_code=202, response_model=UpgradeOut)
def create_upgrade(
    body: UpgradeCreate,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    idempotency: IdempotencyDep,
) -> JSONResponse:
    """Validate and queue an upgrade; poll the `Location` for its status and report."""

    def create() -> StoredResponse:
        job = service.create_upgrade(session, state.settings, tenant_id, body)
        session.flush()
        out = UpgradeOut.model_validate(service.upgrade_out(job))
        return StoredResponse(202, out.model_dump(mode="json"), f"/v1/upgrades/{job.id}")

    stored, created = create_once(session, tenant_id, idempotency, create)
    if created:
        # Enqueued only after the commit: a worker never sees a job the database does not have.
        state.runner.submit(stored.body["id"])
    return stored_json(stored)


@router.get("/methods", response_model=MethodsOut)
def list_methods(state: StateDep, tenant_id: TenantDep) -> dict:
    """Every method `POST /v1/upgrades` accepts: what it does, whether it needs labels, and each
    parameter's type, default and accepted range or choices (as the trainer validates them, and
    within this server's caps: `JOB_MAX_EPOCHS`, `JOB_MAX_HIDDEN_DIM`, …)."""
    return service.all_methods(state.settings)


@router.get("", response_model=UpgradeList)
def list_upgrades(
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    page_token: PageTokenQuery = None,
    limit: LimitQuery = 50,
) -> dict:
    rows, next_token = tenant_page(
        session, UpgradeJob, tenant_id, page_token, limit, state.settings.max_page_size
    )
    stale_after = state.settings.job_stale_after_s
    return {
        "items": [service.upgrade_out(j, stale_after) for j in rows],
        "next_page_token": next_token,
    }


@router.get("/{upgrade_id}", response_model=UpgradeOut)
def get_upgrade(
    upgrade_id: str, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> dict:
    job = service.get_upgrade(session, tenant_id, upgrade_id)
    return service.upgrade_out(job, state.settings.job_stale_after_s)


@router.post(
    "/{upgrade_id}/cancel",
    response_model=UpgradeOut,
    responses={409: {"description": "The upgrade has already finished, failed or been cancelled"}},
)
def cancel_upgrade(upgrade_id: str, session: SessionDep, tenant_id: TenantDep) -> dict:
    """Queued jobs are cancelled at once; running ones stop within one training step."""
    job = service.get_upgrade(session, tenant_id, upgrade_id)
    return service.upgrade_out(service.cancel_upgrade(session, job))


@router.get(
    "/{upgrade_id}/report.html",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {}}, "description": "One self-contained page"},
        409: {"description": "The upgrade has not succeeded (yet): it has no report"},
    },
)
def report_page(upgrade_id: str, session: SessionDep, tenant_id: TenantDep) -> HTMLResponse:
    """The report as a page people read: the verdict in plain words, every alternative (stay,
    the bridges, reindex) per view with plots, the training loss, the uncertainty calibration and
    the backfill curve when measured. Self-contained: it loads nothing from anywhere."""
    job = service.get_upgrade(session, tenant_id, upgrade_id)
    if job.status != SUCCEEDED or not job.report:
        raise conflict(f"upgrade {job.id} is {job.status}: a report exists once it succeeds")
    out = UpgradeOut.model_validate(service.upgrade_out(job)).model_dump(mode="json")
    return HTMLResponse(render_report_html(out))
