"""HTTP for gallery search: a JSON body, or the query rows as one ``.npy`` body."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from app.api.deps import SessionDep, StateDep, TenantDep
from app.core.arrays import load_npy
from app.core.errors import Problem, invalid
from app.core.limits import ArrayLimits
from app.core.schemas import NpyModalityQuery, openapi_body
from app.core.uploads import read_body, read_json_model
from app.galleries.service import get_gallery
from app.migration.returned import DeferredTally
from app.search import npz_answer, service, streaming
from app.search.schemas import NPY_MEDIA_TYPE, SearchRequest, SearchResponse

router = APIRouter(prefix="/v1/galleries", tags=["search"])
DEFAULT_K = SearchRequest.model_fields["k"].default
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


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
    extra["requestBody"]["content"]["multipart/form-data"] = {
        "schema": {
            "type": "object",
            "properties": {
                **{
                    name: {"type": "string", "format": "binary", "description": help_text}
                    for name, help_text in (
                        ("vectors", "old-space query rows, .npy"),
                        ("features", "with model_id: the new backbone's query rows, .npy"),
                        ("old_vectors", "the old model's rows of the same queries, .npy"),
                    )
                },
                "k": {"type": "string", "description": "JSON integer"},
                "rerank": {"type": "string", "description": 'JSON object: {} or {"depth": N}'},
                "model_id": {"type": "string", "description": "JSON string"},
                "modality": {"type": "string", "description": "JSON string"},
            },
        },
        "encoding": {
            name: {"contentType": NPY_MEDIA_TYPE} for name in ("vectors", "features", "old_vectors")
        },
    }
    return extra


@router.post(
    "/{gallery_id}/search",
    response_model=SearchResponse,
    response_model_exclude_none=True,
    openapi_extra=_search_openapi(),
    responses={
        200: {
            "content": {
                streaming.NDJSON_MEDIA_TYPE: {"schema": {"type": "string"}},
                streaming.NPZ_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
            }
        },
        406: {"description": "A two-stage search asked for NDJSON or .npz: ask for JSON"},
        507: {"description": "The data directory filled while an .npz answer was spooled"},
    },
)
async def search(
    gallery_id: str,
    request: Request,
    response: Response,
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
    string, or as multipart `.npy` parts (`vectors` or `features`, and `old_vectors`) with `k`,
    `model_id` and `modality` as JSON parts.

    **Transition search**, while a migration re-embeds the gallery and the old model still
    runs: `model_id`, `features` and `old_vectors` (the old model's vectors of the same queries).
    Items re-embedded for the model are scored by `features` natively, the rest by `old_vectors`
    in the gallery's own space, merged in one list (`space` on each hit); nothing re-embedded is
    exactly the old model's search, everything exactly a reindex. Row counts that differ: 422,
    nothing searched.

    **Two-stage search** (`rerank`, JSON or multipart): candidates from the gallery's own index
    (`depth` per query: by `old_vectors` when given, else by the bridged query), ranked by the
    new model; the queries as `features` or as `texts` (embedded by the model's embedder). A
    candidate without a new vector but with a stored text is embedded in one batched embedder
    call and kept as a re-embedded item of the model. If the embedder fails, the answer is the
    single-stage search with `rerank.degraded` and the header `X-Nobackfill-Degraded`.

    **Large answers, streamed**: with `Accept: application/x-ndjson` the answer is one JSON line
    per query (`{"query": i, "hits": [...]}`) and a last `{"done": true, ...}` line, searched and
    written in chunks of at most `MAX_HITS_PER_REQUEST` hits, so queries × k may exceed it (up
    to `MAX_VECTORS_PER_REQUEST` × `MAX_K`) in bounded memory; a failure after the first chunk
    ends the stream with an `{"error": ...}` line. With `Accept: application/x-npz` (no NumPy
    media type is registered; `x-npz` beside the `x-npy` bodies) the same chunks answer one
    `.npz` archive for `np.load(..., allow_pickle=False)`: `ids` (unicode, the longest id's
    width), `distances` and `scores` (float64), `labels` and `spaces` (unicode, "" where a hit
    has none) as queries × k arrays padded with "" and NaN where a query has fewer than k hits,
    and `counts` (hits per query). It is spooled to a temporary file in the data directory and
    written whole before the response starts, so every failure is a problem with its status (a
    full disk 507); memory holds one chunk, the disk the spool and the archive (each about the
    answer's size, at most `MAX_NPZ_ANSWER_BYTES`: 413). Not for two-stage searches (406)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        given = [n for n, v in (("k", k), ("model_id", model_id), ("modality", modality)) if v]
        if given:
            raise invalid(given[0], "goes in the JSON body (query parameters are for .npy bodies)")
        query = service.SearchQuery.of(await read_json_model(request, SearchRequest))
    elif content_type == "multipart/form-data":
        given = [n for n, v in (("k", k), ("model_id", model_id), ("modality", modality)) if v]
        if given:
            raise invalid(
                given[0], "goes in a part of its own (query parameters are for .npy bodies)"
            )
        query = _multipart_query(
            await read_body(
                request,
                SearchRequest,
                array_fields={"vectors", "features", "old_vectors"},
                string_fields=set(),
                json_fields={"k", "rerank"},
                limits=ArrayLimits.of(state.settings),
                text_fields={"model_id", "modality"},
            )
        )
    elif content_type == NPY_MEDIA_TYPE:
        field = "vectors" if model_id is None else "features"
        rows = load_npy(await request.body(), field, ArrayLimits.of(state.settings))
        query = service.SearchQuery(rows, DEFAULT_K if k is None else k, model_id, modality, field)
    else:
        raise Problem(
            415,
            "Unsupported media type",
            f"send application/json, {NPY_MEDIA_TYPE} or multipart/form-data with .npy parts",
        )

    media = streaming.streamed_media(request.headers.get("accept"))
    if media is not None:
        return await _streamed(gallery_id, state, session, tenant_id, query, media)

    if query.rerank:

        def run_two_stage() -> dict:
            gallery = get_gallery(session, tenant_id, gallery_id)
            results, info = service.search_two_stage(
                session,
                state.settings,
                state.indexes,
                state.models,
                state.embedding,
                tenant_id,
                gallery,
                query,
                state.returned,
            )
            if info["degraded"]:
                response.headers["X-Nobackfill-Degraded"] = info["degraded"]
            return {"results": results, "rerank": info}

        return await run_in_threadpool(run_two_stage)

    def run() -> dict:
        gallery = get_gallery(session, tenant_id, gallery_id)
        results = service.search_gallery(
            session,
            state.settings,
            state.indexes,
            state.models,
            tenant_id,
            gallery,
            query,
            state.returned,
        )
        warning = service.bridged_warning(session, tenant_id, query)
        if warning is None:
            return {"results": results}
        response.headers["X-Nobackfill-Warning"] = "bridge-not-shown-better-than-old-model"
        return {"results": results, "warning": warning}

    # The scan and the re-rank release the GIL: other requests are served meanwhile.
    return await run_in_threadpool(run)


async def _streamed(
    gallery_id: str,
    state: Any,
    session: Any,
    tenant_id: str,
    query: service.SearchQuery,
    media: str,
) -> StreamingResponse:
    """The NDJSON answer (``app.search.streaming``): the first chunk searched here, on the
    request's session, so its errors are still problems; each later chunk on a session of its
    own as the client reads. The ``.npz`` answer (``app.search.npz_answer``): every chunk
    searched so, and the archive written, before the response starts."""
    streaming.check_streamable(state.settings, query)
    parts = streaming.chunks(state.settings, query)
    headers: dict[str, str] = {}
    # What the answer returns is tallied once it is sent (NDJSON: as each chunk is written); an
    # .npz answer refused after its search (too large, a full disk) returned nothing.
    deferred = DeferredTally(state.returned)
    tally = deferred if media == streaming.NPZ_MEDIA_TYPE else state.returned

    def search_part(own: Any, part: service.SearchQuery) -> list:
        gallery = get_gallery(own, tenant_id, gallery_id)
        return service.search_gallery(
            own,
            state.settings,
            state.indexes,
            state.models,
            tenant_id,
            gallery,
            part,
            tally,
        )

    def first() -> list:
        results = search_part(session, parts[0])
        if service.bridged_warning(session, tenant_id, query) is not None:
            headers["X-Nobackfill-Warning"] = "bridge-not-shown-better-than-old-model"
        # The stream may last: its connection goes back to the pool now, not when it ends.
        session.rollback()
        return results

    def later(part: service.SearchQuery) -> list:
        with state.db.sessions() as own:
            try:
                return search_part(own, part)
            finally:
                own.rollback()

    async def search_chunk(part: service.SearchQuery) -> list:
        return await run_in_threadpool(later, part)

    if media == streaming.NPZ_MEDIA_TYPE:
        # Before any work: the least such an answer can take (one-character strings).
        npz_answer.check_size(len(query.vectors), query.k, {}, state.settings.max_npz_answer_bytes)

        def archived() -> npz_answer.ArchiveFile:
            def searched() -> Iterator[list]:
                yield first()
                for part in parts[1:]:
                    yield later(part)

            return npz_answer.build(
                searched(),
                state.settings.data_dir,
                query.k,
                len(query.vectors),
                state.settings.max_npz_answer_bytes,
            )

        archive = await run_in_threadpool(archived)
        deferred.commit()
        return StreamingResponse(
            archive.pieces(),
            media_type=streaming.NPZ_MEDIA_TYPE,
            headers=headers
            | {
                "Content-Length": str(archive.size),
                "Content-Disposition": 'attachment; filename="search.npz"',
            },
            background=BackgroundTask(archive.close),
        )

    results = await run_in_threadpool(first)
    return StreamingResponse(
        streaming.stream(results, parts[1:], search_chunk, len(query.vectors), query.k),
        media_type=streaming.NDJSON_MEDIA_TYPE,
        headers=headers,
    )


def _multipart_query(fields: dict[str, Any]) -> service.SearchQuery:
    k = fields.get("k", DEFAULT_K)
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise invalid("k", "a JSON integer ≥ 1")
    for name in ("model_id", "modality"):
        value = fields.get(name)
        if value is not None and not (isinstance(value, str) and _NAME.fullmatch(value)):
            raise invalid(name, "a JSON string of 1–64 letters, digits, '_', '.' or '-'")
    model_id = fields.get("model_id")
    if model_id is not None and len(model_id) > 40:
        raise invalid("model_id", "a model id is at most 40 characters")
    query = service.SearchQuery.build(
        fields.get("vectors"),
        fields.get("features"),
        fields.get("old_vectors"),
        k,
        model_id,
        fields.get("modality"),
    )
    rerank = fields.get("rerank")
    if rerank is None:
        return query
    depth = rerank.get("depth") if isinstance(rerank, dict) else None
    if (
        not isinstance(rerank, dict)
        or set(rerank) - {"depth"}
        or not (
            depth is None or (isinstance(depth, int) and not isinstance(depth, bool) and depth >= 1)
        )
    ):
        raise invalid("rerank", 'a JSON object: {} or {"depth": N} with N ≥ 1')
    if model_id is None:
        raise invalid("rerank", "a two-stage search needs model_id (the new model)")
    return replace(query, rerank=True, rerank_depth=depth)
