"""HTTP for galleries and their vectors (thin: parsing and status codes only)."""

from __future__ import annotations

import io
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.api.deps import IdempotencyDep, SessionDep, StateDep, TenantDep
from app.core.errors import FieldError, invalid, invalid_fields
from app.core.idempotency import StoredResponse, create_once, stored_json
from app.core.limits import ArrayLimits
from app.core.schemas import CascadeQuery, LimitQuery, PageTokenQuery, openapi_body
from app.core.tenancy import tenant_page
from app.core.uploads import read_body
from app.datasets.service import refuse_while_paired
from app.galleries import service
from app.galleries.models import Gallery
from app.galleries.schemas import (
    VECTORS_MULTIPART,
    BackfillPlanOut,
    BackfillPlanRequest,
    DeleteResult,
    GalleryCascade,
    GalleryCreate,
    GalleryDeleted,
    GalleryList,
    GalleryOut,
    UpsertResult,
    VectorsDelete,
    VectorsOut,
    VectorsUpsert,
)
from app.migration import in_place, progress, reembed
from app.search.schemas import NPY_MEDIA_TYPE
from app.vectors.engine import ATTACHED

router = APIRouter(prefix="/v1/galleries", tags=["galleries"])


def _gallery_out(session: Session, gallery: Gallery) -> dict[str, Any]:
    return service.gallery_out(session, gallery, progress.progress(session, gallery))


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
        out = GalleryOut.model_validate(_gallery_out(session, gallery))
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
    return {"items": [_gallery_out(session, g) for g in rows], "next_page_token": next_token}


@router.get("/{gallery_id}", response_model=GalleryOut)
def get_gallery(gallery_id: str, session: SessionDep, tenant_id: TenantDep) -> dict:
    gallery = service.get_gallery(session, tenant_id, gallery_id)
    return _gallery_out(session, gallery)


@router.delete(
    "/{gallery_id}",
    status_code=204,
    responses={
        200: {"model": GalleryDeleted, "description": "deleted with ?cascade=true"},
        409: {"description": "still in use"},
    },
)
def delete_gallery(
    gallery_id: str,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    cascade: CascadeQuery = False,
) -> Response:
    """Delete a gallery and every vector stored for it. 409 while datasets pair with it, an
    upgrade trains on it, or it holds re-embedded items (``?cascade=true`` deletes those with it
    and answers 200 with how many)."""
    gallery = service.get_gallery(session, tenant_id, gallery_id)
    refuse_while_paired(session, gallery)
    cascaded = service.delete_gallery(session, state.indexes, gallery, cascade=cascade)
    if not cascade:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    body = GalleryDeleted(id=gallery_id, cascaded=GalleryCascade(**cascaded))
    return JSONResponse(body.model_dump(mode="json"))


@router.post(
    "/{gallery_id}/vectors",
    response_model=UpsertResult,
    response_model_exclude_none=True,
    openapi_extra=openapi_body(VectorsUpsert, multipart=VECTORS_MULTIPART),
)
async def upsert_vectors(
    gallery_id: str, request: Request, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> dict:
    """Upsert by id, all or nothing: JSON, or multipart `.npy` parts (`ids`, `vectors` or
    `features`, `labels`, `texts`; `metadata` as JSON text; `model_id` as plain text or a JSON
    string). `texts`: each item's document text, what a two-stage search embeds lazily."""
    # The body first, with no database connection held while it arrives (a slow client must
    # not hold one); then the lookup and the write, in the thread pool.
    fields = await read_body(
        request,
        VectorsUpsert,
        array_fields={"vectors", "features"},
        string_fields={"ids", "labels", "texts"},
        json_fields={"metadata"},
        limits=ArrayLimits.of(state.settings),
        text_fields={"model_id"},
    )
    if "ids" not in fields:
        raise invalid("ids", "required")
    # The write waits for row (or SQLite's database) locks: in the thread pool, never on the
    # event loop, which every other request needs meanwhile.
    gallery = await run_in_threadpool(service.get_gallery, session, tenant_id, gallery_id)
    return await run_in_threadpool(_store_vectors, gallery, fields, state, session, tenant_id)


def _store_vectors(
    gallery: Gallery, fields: dict, state: StateDep, session: SessionDep, tenant_id: str
) -> dict:
    if "model_id" in fields:
        return _store_reembedded(gallery, fields, state, session, tenant_id)
    if "vectors" in fields and "features" in fields:
        raise invalid("features", "give vectors or features, not both")
    matrix_field = "features" if "features" in fields else "vectors"
    batch = service.VectorBatch(
        ids=fields["ids"],
        matrix=fields.get(matrix_field),
        matrix_field=matrix_field,
        labels=fields.get("labels"),
        metadata=fields.get("metadata"),
        texts=fields.get("texts"),
    )
    upserted, count = service.upsert_vectors(
        session, state.settings, state.indexes, state.models, gallery, batch
    )
    return {"upserted": upserted, "count": count}


def _store_reembedded(
    gallery: Gallery, fields: dict, state: StateDep, session: SessionDep, tenant_id: str
) -> dict:
    """Re-embedded items: ids and features only, for a backbone model of this space."""
    extra = sorted(set(fields) - {"ids", "features", "model_id"})
    if extra:
        raise invalid_fields(
            [FieldError(f, "not accepted with model_id (re-embedded items)") for f in extra]
        )
    model_id = fields["model_id"]
    if not isinstance(model_id, str) or not 1 <= len(model_id) <= 40:
        raise invalid("model_id", "expected a model id (plain text or a JSON string in multipart)")
    row = reembed.backbone_for(session, tenant_id, gallery, model_id)
    if gallery.vector_storage in ATTACHED:
        # An attached collection keeps them itself: Qdrant as a named vector of the same
        # points, Milvus in a sibling collection keyed by the same primary keys.
        upload = reembed.checked_features(
            state.settings, row, fields["ids"], fields.get("features")
        )
        return in_place.store_in_place(session, state.indexes, gallery, row, upload)
    stored, reembedded = reembed.store_reembedded(
        session, state.settings, state.indexes, gallery, row, fields["ids"], fields.get("features")
    )
    return {"upserted": stored, "count": gallery.count, "reembedded": reembedded}


@router.post("/{gallery_id}/backfill-plan", response_model=BackfillPlanOut)
def backfill_plan(
    gallery_id: str,
    body: BackfillPlanRequest,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
) -> dict:
    """The next items to re-embed for `model_id`, most valuable first (items already
    re-embedded are left out), and the quality expected against the share re-embedded, learned
    and simulated on the upgrade's held-out data."""
    gallery = service.get_gallery(session, tenant_id, gallery_id)
    row = reembed.backbone_for(session, tenant_id, gallery, body.model_id)
    # This process's searches of the gallery count in the plan, not only those already written.
    state.returned.flush(gallery.id)
    return reembed.plan(
        session, state.indexes, state.models, gallery, row, body.fraction, body.count
    )


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
