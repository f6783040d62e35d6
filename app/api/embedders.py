"""HTTP for embedders: the new backbone's embedding endpoints a tenant registers (issue 43)."""

from __future__ import annotations

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse

from app.api.deps import IdempotencyDep, SessionDep, StateDep, TenantDep
from app.core.idempotency import StoredResponse, create_once, stored_json
from app.core.schemas import LimitQuery, PageTokenQuery
from app.core.tenancy import tenant_page
from app.embedders import service
from app.embedders.models import Embedder
from app.embedders.schemas import EmbedderCreate, EmbedderList, EmbedderOut

router = APIRouter(prefix="/v1/embedders", tags=["embedders"])


@router.post("", status_code=201, response_model=EmbedderOut)
def create_embedder(
    body: EmbedderCreate,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    idempotency: IdempotencyDep,
) -> JSONResponse:
    """Register an embedding endpoint (OpenAI-compatible embeddings protocol). Its URL must fall
    under `NOBACKFILL_EMBEDDER_ALLOWED_URLS`, its key (if any) comes from the server environment
    variable `api_key_env` and is never shown. Then `PATCH /v1/models/{id}` with `embedder_id`
    lets that model's two-stage searches embed query texts and candidates."""

    def create() -> StoredResponse:
        row = service.create_embedder(session, state.settings, tenant_id, body)
        session.flush()
        out = EmbedderOut.model_validate(service.embedder_out(row))
        return StoredResponse(201, out.model_dump(mode="json"), f"/v1/embedders/{row.id}")

    return stored_json(create_once(session, tenant_id, idempotency, create)[0])


@router.get("", response_model=EmbedderList)
def list_embedders(
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    page_token: PageTokenQuery = None,
    limit: LimitQuery = 50,
) -> dict:
    rows, next_token = tenant_page(
        session, Embedder, tenant_id, page_token, limit, state.settings.max_page_size
    )
    return {"items": [service.embedder_out(r) for r in rows], "next_page_token": next_token}


@router.get("/{embedder_id}", response_model=EmbedderOut)
def get_embedder(embedder_id: str, session: SessionDep, tenant_id: TenantDep) -> dict:
    return service.embedder_out(service.get_embedder(session, tenant_id, embedder_id))


@router.delete("/{embedder_id}", status_code=204, responses={409: {"description": "in use"}})
def delete_embedder(embedder_id: str, session: SessionDep, tenant_id: TenantDep) -> Response:
    """Delete an embedder; 409 while a model names it."""
    service.delete_embedder(session, service.get_embedder(session, tenant_id, embedder_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)
