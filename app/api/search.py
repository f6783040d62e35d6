"""HTTP for gallery search: a JSON body, or the query rows as one ``.npy`` body."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from app.api.deps import SessionDep, StateDep, TenantDep
from app.core.arrays import load_npy
from app.core.errors import Problem, invalid
from app.core.schemas import NpyModalityQuery, openapi_body
from app.core.uploads import read_json_model
from app.galleries.service import get_gallery
from app.search import service
from app.search.schemas import NPY_MEDIA_TYPE, SearchRequest, SearchResponse

router = APIRouter(prefix="/v1/galleries", tags=["search"])
DEFAULT_K = SearchRequest.model_fields["k"].default


def _search_openapi() -> dict[str, Any]:
    extra = openapi_body(SearchRequest)
    extra["requestBody"]["content"][NPY_MEDIA_TYPE] = {
        "schema": {
            "type": "string",
            "format": "binary",
            "description": "the query rows as one float16/32/64 N×D .npy array; k, model_id "
            "and modality as query parameters",
        }
    }
    return extra


@router.post(
    "/{gallery_id}/search",
    response_model=SearchResponse,
    response_model_exclude_none=True,
    openapi_extra=_search_openapi(),
)
async def search(
    gallery_id: str,
    request: Request,
    state: StateDep,
    session: SessionDep,
    tenant_id: TenantDep,
    k: Annotated[
        int | None, Query(ge=1, description=f"{NPY_MEDIA_TYPE} bodies only (default {DEFAULT_K})")
    ] = None,
    model_id: Annotated[
        str | None, Query(min_length=1, max_length=40, description=f"{NPY_MEDIA_TYPE} only")
    ] = None,
    modality: NpyModalityQuery = None,
) -> dict:
    """k nearest gallery items per query, by exact Lorentz distance, each with its `distance` and
    `score` (cosine similarity for cosine galleries). Without `model_id` the rows are old-space
    `vectors` (what the gallery stores); with `model_id` they are the new backbone's `features`,
    that model's inputs (`vectors` is accepted there too, the former spelling); an incompatible
    model answers 409. The rows come as JSON or, faster for large batches, as one `.npy` body
    (`Content-Type: application/x-npy`) with `k`, `model_id` and `modality` in the query
    string."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        given = [n for n, v in (("k", k), ("model_id", model_id), ("modality", modality)) if v]
        if given:
            raise invalid(given[0], "goes in the JSON body (query parameters are for .npy bodies)")
        query = service.SearchQuery.of(await read_json_model(request, SearchRequest))
    elif content_type == NPY_MEDIA_TYPE:
        field = "vectors" if model_id is None else "features"
        rows = load_npy(await request.body(), field)
        query = service.SearchQuery(rows, DEFAULT_K if k is None else k, model_id, modality, field)
    else:
        raise Problem(415, "Unsupported media type", f"send application/json or {NPY_MEDIA_TYPE}")

    def run() -> dict:
        gallery = get_gallery(session, tenant_id, gallery_id)
        results = service.search_gallery(
            session, state.settings, state.indexes, state.models, tenant_id, gallery, query
        )
        return {"results": results}

    # The scan and the re-rank release the GIL: other requests are served meanwhile.
    return await run_in_threadpool(run)
