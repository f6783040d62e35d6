"""HTTP for datasets and their items."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.core.deps import IdempotencyDep, SessionDep, StateDep, TenantDep
from app.core.errors import invalid
from app.core.idempotency import StoredResponse, create_once, stored_json
from app.core.schemas import LimitQuery, PageTokenQuery, openapi_body
from app.core.tenancy import tenant_page
from app.core.uploads import read_body
from app.datasets import service
from app.datasets.models import Dataset
from app.datasets.schemas import (
    ITEMS_MULTIPART,
    DatasetCreate,
    DatasetList,
    DatasetOut,
    ItemsResult,
    ItemsUpload,
)

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


@router.post("", status_code=201, response_model=DatasetOut)
def create_dataset(
    body: DatasetCreate,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    idempotency: IdempotencyDep,
) -> JSONResponse:
    def create() -> StoredResponse:
        dataset = service.create_dataset(session, state.settings, tenant_id, body)
        session.flush()
        out = DatasetOut.model_validate(service.dataset_out(dataset))
        return StoredResponse(201, out.model_dump(mode="json"), f"/v1/datasets/{dataset.id}")

    return stored_json(create_once(session, tenant_id, idempotency, create)[0])


@router.get("", response_model=DatasetList)
def list_datasets(
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    page_token: PageTokenQuery = None,
    limit: LimitQuery = 50,
) -> dict:
    rows, next_token = tenant_page(
        session, Dataset, tenant_id, page_token, limit, state.settings.max_page_size
    )
    return {"items": [service.dataset_out(d) for d in rows], "next_page_token": next_token}


@router.get("/{dataset_id}", response_model=DatasetOut)
def get_dataset(dataset_id: str, session: SessionDep, tenant_id: TenantDep) -> dict:
    return service.dataset_out(service.get_dataset(session, tenant_id, dataset_id))


@router.post(
    "/{dataset_id}/items",
    response_model=ItemsResult,
    openapi_extra=openapi_body(ItemsUpload, multipart=ITEMS_MULTIPART),
)
async def upload_items(
    dataset_id: str, request: Request, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> dict:
    """Upsert items by id, all or nothing: JSON, or multipart `.npy` parts (`ids`, `features`
    or one `modalities.<name>` per modality, `labels`)."""
    dataset = service.get_dataset(session, tenant_id, dataset_id)
    fields = await read_body(
        request,
        ItemsUpload,
        array_fields={"features", "modalities"},
        string_fields={"ids", "labels"},
        json_fields=set(),
    )
    if "ids" not in fields:
        raise invalid("ids", "required")
    upserted, count = service.upsert_items(
        session,
        state.settings,
        dataset,
        fields["ids"],
        fields.get("features"),
        fields.get("modalities"),
        fields.get("labels"),
    )
    return {"upserted": upserted, "count": count}
