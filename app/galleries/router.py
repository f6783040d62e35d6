"""HTTP for galleries and their vectors (thin: parsing and status codes only)."""

from __future__ import annotations

import io
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse

from app.core.deps import IdempotencyDep, SessionDep, StateDep, TenantDep
from app.core.errors import invalid
from app.core.idempotency import StoredResponse, create_once, stored_json
from app.core.schemas import LimitQuery, PageTokenQuery, openapi_body
from app.core.tenancy import tenant_page
from app.core.uploads import read_body
from app.galleries import service
from app.galleries.models import Gallery
from app.galleries.schemas import (
    VECTORS_MULTIPART,
    DeleteResult,
    GalleryCreate,
    GalleryList,
    GalleryOut,
    UpsertResult,
    VectorsDelete,
    VectorsOut,
    VectorsUpsert,
)
from app.search.schemas import NPY_MEDIA_TYPE

router = APIRouter(prefix="/v1/galleries", tags=["galleries"])


@router.post("", status_code=201, response_model=GalleryOut)
def create_gallery(
    body: GalleryCreate,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    idempotency: IdempotencyDep,
) -> JSONResponse:
    def create() -> StoredResponse:
        gallery = service.create_gallery(session, state.settings, tenant_id, body)
        session.flush()
        out = GalleryOut.model_validate(service.gallery_out(session, gallery))
        return StoredResponse(201, out.model_dump(mode="json"), f"/v1/galleries/{gallery.id}")

    return stored_json(create_once(session, tenant_id, idempotency, create)[0])


@router.get("", response_model=GalleryList)
def list_galleries(
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    page_token: PageTokenQuery = None,
    limit: LimitQuery = 50,
) -> dict:
    rows, next_token = tenant_page(
        session, Gallery, tenant_id, page_token, limit, state.settings.max_page_size
    )
    return {"items": [service.gallery_out(session, g) for g in rows], "next_page_token": next_token}


@router.get("/{gallery_id}", response_model=GalleryOut)
def get_gallery(gallery_id: str, session: SessionDep, tenant_id: TenantDep) -> dict:
    return service.gallery_out(session, service.get_gallery(session, tenant_id, gallery_id))


@router.delete("/{gallery_id}", status_code=204)
def delete_gallery(
    gallery_id: str, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> Response:
    gallery = service.get_gallery(session, tenant_id, gallery_id)
    service.delete_gallery(session, state.indexes, gallery)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{gallery_id}/vectors",
    response_model=UpsertResult,
    openapi_extra=openapi_body(VectorsUpsert, multipart=VECTORS_MULTIPART),
)
async def upsert_vectors(
    gallery_id: str, request: Request, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> dict:
    """Upsert by id, all or nothing: JSON, or multipart `.npy` parts (`ids`, `vectors` or
    `features`, `labels`; `metadata` as JSON text)."""
    gallery = service.get_gallery(session, tenant_id, gallery_id)
    fields = await read_body(
        request,
        VectorsUpsert,
        array_fields={"vectors", "features"},
        string_fields={"ids", "labels"},
        json_fields={"metadata"},
    )
    if "ids" not in fields:
        raise invalid("ids", "required")
    if "vectors" in fields and "features" in fields:
        raise invalid("features", "give vectors or features, not both")
    matrix_field = "features" if "features" in fields else "vectors"
    batch = service.VectorBatch(
        ids=fields["ids"],
        matrix=fields.get(matrix_field),
        matrix_field=matrix_field,
        labels=fields.get("labels"),
        metadata=fields.get("metadata"),
    )
    upserted, count = service.upsert_vectors(
        session, state.settings, state.indexes, state.models, gallery, batch
    )
    return {"upserted": upserted, "count": count}


@router.get(
    "/{gallery_id}/vectors",
    response_model=VectorsOut,
    responses={
        200: {
            "content": {
                NPY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
            },
            "description": f"JSON, or with `Accept: {NPY_MEDIA_TYPE}` the vectors alone as one "
            "N×dim float32 .npy array (rows in the order of `ids`)",
        }
    },
)
def read_vectors(
    gallery_id: str,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    ids: Annotated[
        list[str] | None,
        Query(description="repeat per item: `?ids=a&ids=b` (as many as fit a URL)"),
    ] = None,
    accept: Annotated[str | None, Header()] = None,
) -> dict | Response:
    """Stored vectors by item id, in the order asked for. Ids the gallery does not hold answer
    404 naming each (`ids[n]`)."""
    gallery = service.get_gallery(session, tenant_id, gallery_id)
    if not ids:
        raise invalid("ids", "required: give ?ids=…, once per item")
    found, matrix, labels, metadata = service.read_vectors(session, state.settings, gallery, ids)
    if accept is not None and NPY_MEDIA_TYPE in accept.lower():
        buf = io.BytesIO()
        np.save(buf, matrix, allow_pickle=False)
        return Response(buf.getvalue(), media_type=NPY_MEDIA_TYPE)
    return {"ids": found, "vectors": matrix.tolist(), "labels": labels, "metadata": metadata}


@router.delete("/{gallery_id}/vectors", response_model=DeleteResult)
def delete_vectors(
    gallery_id: str, body: VectorsDelete, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> dict:
    gallery = service.get_gallery(session, tenant_id, gallery_id)
    deleted, count = service.delete_vectors(
        session, state.settings, state.indexes, gallery, body.ids, body.missing_ok
    )
    return {"deleted": deleted, "count": count}
