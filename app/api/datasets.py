"""HTTP for datasets and their items."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.api.deps import IdempotencyDep, SessionDep, StateDep, TenantDep
from app.core.errors import invalid
from app.core.idempotency import StoredResponse, create_once, stored_json
from app.core.limits import ArrayLimits
from app.core.schemas import LimitQuery, PageTokenQuery, openapi_body
from app.core.tenancy import tenant_page
from app.core.uploads import read_body
from app.datasets import queries, service
from app.datasets.models import Dataset
from app.datasets.schemas import (
    ITEMS_MULTIPART,
    QUERIES_MULTIPART,
    DatasetCreate,
    DatasetList,
    DatasetOut,
    ItemsResult,
    ItemsUpload,
    QueriesDeleted,
    QueriesResult,
    QueriesUpload,
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


@router.delete("/{dataset_id}", status_code=204)
def delete_dataset(dataset_id: str, session: SessionDep, tenant_id: TenantDep) -> Response:
    """Delete the dataset, its items and its queries; 409 while an upgrade trains on it."""
    service.delete_dataset(session, service.get_dataset(session, tenant_id, dataset_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


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
    # The body first, with no database connection held while it arrives.
    fields = await read_body(
        request,
        ItemsUpload,
        array_fields={"features", "modalities"},
        string_fields={"ids", "labels"},
        json_fields=set(),
        limits=ArrayLimits.of(state.settings),
    )
    if "ids" not in fields:
        raise invalid("ids", "required")
    dataset = await run_in_threadpool(service.get_dataset, session, tenant_id, dataset_id)
    # The write waits for locks: in the thread pool, never on the event loop.
    upserted, count = await run_in_threadpool(
        service.upsert_items,
        session,
        state.settings,
        dataset,
        fields["ids"],
        fields.get("features"),
        fields.get("modalities"),
        fields.get("labels"),
    )
    return {"upserted": upserted, "count": count}


@router.post(
    "/{dataset_id}/queries",
    response_model=QueriesResult,
    openapi_extra=openapi_body(QueriesUpload, multipart=QUERIES_MULTIPART),
)
async def upload_queries(
    dataset_id: str, request: Request, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> dict:
    """Upsert logged queries by id, all or nothing: JSON, or multipart `.npy` parts (`ids`,
    `features`, `old_vectors`) with `relevant_ids` as a JSON part. The dataset needs a gallery
    (409 otherwise): relevant ids are its item ids, old vectors are in its space."""
    # The body first, with no database connection held while it arrives.
    fields = await read_body(
        request,
        QueriesUpload,
        array_fields={"features", "old_vectors"},
        string_fields={"ids"},
        json_fields={"relevant_ids"},
        limits=ArrayLimits.of(state.settings),
    )
    for required in ("ids", "features"):
        if required not in fields:
            raise invalid(required, "required")
    dataset = await run_in_threadpool(service.get_dataset, session, tenant_id, dataset_id)
    upserted = await run_in_threadpool(
        queries.upsert_queries,
        session,
        state.settings,
        dataset,
        fields["ids"],
        fields["features"],
        fields.get("old_vectors"),
        fields.get("relevant_ids"),
    )
    return {"upserted": upserted, "queries": service.query_counts(dataset)}


@router.delete("/{dataset_id}/queries", response_model=QueriesDeleted)
def delete_queries(dataset_id: str, session: SessionDep, tenant_id: TenantDep) -> dict:
    """Clear the dataset's query log (to upload it again, e.g. with old vectors this time)."""
    dataset = service.get_dataset(session, tenant_id, dataset_id)
    return {"deleted": queries.delete_queries(session, dataset)}
