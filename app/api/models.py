"""HTTP for trained models."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from app.api.deps import SessionDep, StateDep, TenantDep
from app.core.arrays import check_batch_size, load_npy
from app.core.errors import Problem, invalid
from app.core.limits import ArrayLimits
from app.core.schemas import (
    CascadeQuery,
    LimitQuery,
    NpyModalityQuery,
    PageTokenQuery,
    openapi_body,
)
from app.core.tenancy import tenant_page
from app.core.uploads import read_json_model
from app.embedders.service import set_model_embedder
from app.galleries.service import refuse_while_bound
from app.migration.in_place import forget_model
from app.models import service
from app.models.export import EXPORT_FORMATS
from app.models.models import TrainedModel
from app.models.schemas import (
    EmbedRequest,
    EmbedResponse,
    ModelCascade,
    ModelDeleted,
    ModelList,
    ModelOut,
    ModelPatch,
)
from app.search.schemas import NPY_MEDIA_TYPE

router = APIRouter(prefix="/v1/models", tags=["models"])


def model_out(row: TrainedModel) -> dict[str, Any]:
    rotation = service.rotation_matrix(row)
    return {
        "id": row.id,
        "kind": row.kind,
        "method": row.method,
        "upgrade_id": row.upgrade_id,
        "parent_id": row.parent_id,
        "root_id": row.root_id,
        "gallery_id": row.trained_on_gallery_id,
        "space": (
            {"model_name": row.space_model_name, "dim": row.space_dim, "lift": row.lift}
            if row.kind == service.BACKBONE
            else None
        ),
        "modalities": row.modalities,
        "input_dims": row.input_dims,
        "output_dim": row.output_dim,
        "curv": row.curv,
        "rotation_since_parent": None if rotation is None else rotation.tolist(),
        "artifact_sha256": row.artifact_sha256,
        "artifact_bytes": row.artifact_bytes,
        "embedder_id": row.embedder_id,
        "created_at": row.created_at,
    }


@router.get("", response_model=ModelList)
def list_models(
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    page_token: PageTokenQuery = None,
    limit: LimitQuery = 50,
) -> dict:
    rows, next_token = tenant_page(
        session, TrainedModel, tenant_id, page_token, limit, state.settings.max_page_size
    )
    return {"items": [model_out(r) for r in rows], "next_page_token": next_token}


@router.get("/{model_id}", response_model=ModelOut)
def get_model(model_id: str, session: SessionDep, tenant_id: TenantDep) -> dict:
    return model_out(service.get_model(session, tenant_id, model_id))


@router.patch("/{model_id}", response_model=ModelOut)
def patch_model(model_id: str, body: ModelPatch, session: SessionDep, tenant_id: TenantDep) -> dict:
    """Set or clear the model's `embedder_id`: the embedder (`POST /v1/embedders`) whose vectors
    are this model's inputs, used by two-stage searches to embed query `texts` and the
    candidates that have no new vector yet. Its dimension must be the model's input dimension."""
    row = service.get_model(session, tenant_id, model_id)
    set_model_embedder(session, tenant_id, row, body.embedder_id)
    return model_out(row)


@router.delete(
    "/{model_id}",
    status_code=204,
    responses={
        200: {"model": ModelDeleted, "description": "deleted with ?cascade=true"},
        409: {"description": "still in use"},
    },
)
def delete_model(
    model_id: str,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    cascade: CascadeQuery = False,
) -> Response:
    """Delete a model and its artifact files. 409 while a model-bound gallery holds its vectors,
    a newer continual version continues from it, an upgrade is training from it, or galleries
    hold items re-embedded for it (``?cascade=true`` deletes those with it and answers 200 with
    how many)."""
    row = service.get_model(session, tenant_id, model_id)
    refuse_while_bound(session, row.id)
    cascaded = service.delete_model(session, state.settings, state.models, row, cascade=cascade)
    forget_model(session, cascaded["by_gallery"], model_id)
    if not cascade:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    body = ModelDeleted(id=model_id, cascaded=ModelCascade(**cascaded))
    return JSONResponse(body.model_dump(mode="json"))


@router.get(
    "/{model_id}/artifact",
    response_class=Response,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "the artifact"},
        304: {"description": "If-None-Match matched the ETag"},
    },
)
def download_artifact(
    model_id: str,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The model artifact as stored (a `torch.save` blob: kind, config and weights; load it with
    `torch.load(..., weights_only=True)`), verified against its SHA-256 before it is sent. `ETag`
    is the quoted SHA-256 hex digest, `Repr-Digest` the RFC 9530 form of the same digest."""
    row = service.get_model(session, tenant_id, model_id)
    etag = f'"{row.artifact_sha256}"'
    if if_none_match is not None and etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
    blob = service.read_artifact(state.settings, row)
    digest = base64.b64encode(bytes.fromhex(row.artifact_sha256)).decode()
    return Response(
        blob,
        media_type="application/octet-stream",
        headers={
            "ETag": etag,
            "Repr-Digest": f"sha-256=:{digest}:",
            "Content-Disposition": f'attachment; filename="{row.id}.pt"',
        },
    )


@router.get(
    "/{model_id}/export",
    response_class=Response,
    responses={200: {"content": {"application/zip": {}}, "description": "the export bundle"}},
)
def export_model(
    model_id: str,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    export_format: Annotated[
        str, Query(alias="format", max_length=32, description=f"one of {list(EXPORT_FORMATS)}")
    ] = "onnx",
    modality: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=64,
            pattern=r"^[A-Za-z0-9_.-]+$",
            description="which modality's graph (default: the model's first)",
        ),
    ] = None,
) -> Response:
    """A zip for searching your own vector database without the service: `model.onnx` (new
    backbone features → `query`, `point`; a dynamic batch axis), its external data file when the
    weights are large, `gallery.onnx` where the gallery side needs a transform, and
    `manifest.json` (inputs, outputs, the old space and exactly how to search). For a cosine
    gallery, `query` searched by cosine against the raw old vectors reproduces this service's
    ranking; otherwise `query` (the lifted query, time coordinate negated) searched by inner
    product against the lifted gallery vectors does."""
    row = service.get_model(session, tenant_id, model_id)
    bundle = service.export_model(state.models, row, export_format, modality)
    return Response(
        bundle,
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="{row.id}.{export_format}.zip"'},
    )


def _embed_openapi() -> dict[str, Any]:
    extra = openapi_body(EmbedRequest)
    extra["requestBody"]["content"][NPY_MEDIA_TYPE] = {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": "the features as one float16/32/64 N×D .npy array; modality as a "
            "query parameter",
        }
    }
    return extra


@router.post("/{model_id}/embed", response_model=EmbedResponse, openapi_extra=_embed_openapi())
async def embed(
    model_id: str,
    request: Request,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    modality: NpyModalityQuery = None,
) -> dict:
    """Embed the NEW backbone's `features` (the model's inputs; old-space vectors are never
    embedded, galleries store and search them as they are): points in the model's frame and
    their uncertainty. JSON (`features`, `modality`) or, for large batches, one `.npy` body
    (`Content-Type: application/x-npy`) with `modality` in the query string."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        if modality is not None:
            raise invalid(
                "modality", "goes in the JSON body (query parameters are for .npy bodies)"
            )
        body = await read_json_model(request, EmbedRequest)
        features: Any = body.features
        modality = body.modality
    elif content_type == NPY_MEDIA_TYPE:
        features = load_npy(await request.body(), "features", ArrayLimits.of(state.settings))
    else:
        raise Problem(415, "Unsupported media type", f"send application/json or {NPY_MEDIA_TYPE}")

    def run() -> dict:
        row = service.get_model(session, tenant_id, model_id)
        check_batch_size(len(features), "features", state.settings.max_vectors_per_request)
        points, chosen = service.embed_features(
            state.models, state.settings, row, features, modality
        )
        return {
            "modality": chosen,
            "embeddings": points.tolist(),
            "uncertainty": service.point_uncertainty(points, row.curv).tolist(),
        }

    return await run_in_threadpool(run)
