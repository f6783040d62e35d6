"""Large search answers, streamed (issue 45 item 6): `Accept: application/x-ndjson`, or
`application/x-npz` for the same chunks as one NumPy archive (``app.search.npz_answer``).

A JSON answer is built whole, so its size — queries × k hits — is bounded per request
(``MAX_HITS_PER_REQUEST``, 422 before any work). A streamed answer is not built whole: the
queries are searched in chunks of at most ``MAX_HITS_PER_REQUEST`` hits (and ``CHUNK_POINT_BYTES``
of their points) and each chunk's lines are written before the next is searched, so the memory behind an answer is one chunk's, whatever
the request asks (within ``MAX_K`` and ``MAX_VECTORS_PER_REQUEST``). One line per query,
``{"query": i, "hits": [...]}`` (the hits exactly as the JSON answer's), then a last line
``{"done": true, "queries": n, "k": k}``: a client that does not see it knows the answer was cut.

The first chunk is searched before the response starts, so everything a request can get wrong
(an unknown gallery or model, a bad dimension, a conflict) is still a problem+json with its
status. A later chunk that fails (the database gone mid-answer) ends the stream with an
``{"error": {...}}`` line instead of ``done``: the status line is long sent.

Two-stage searches are not streamed: their candidates are bounded per request
(``RERANK_MAX_CANDIDATES``) and their embedder call is one per request, which chunks would
break (406 says so).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import numpy as np

from app.core.arrays import check_batch_size
from app.core.errors import Problem, invalid
from app.core.settings import Settings
from app.search.service import SearchQuery

log = logging.getLogger(__name__)

NDJSON_MEDIA_TYPE = "application/x-ndjson"
# No NumPy media type is registered: an ``x-`` type beside the ``application/x-npy`` bodies
# (``app.search.npz_answer`` says why not ``application/zip``).
NPZ_MEDIA_TYPE = "application/x-npz"


def streamed_media(accept: str | None) -> str | None:
    """The answer's form the ``Accept`` header asks for first: ``NDJSON_MEDIA_TYPE`` or
    ``NPZ_MEDIA_TYPE``; None for JSON (the default, and what ``*/*`` gets)."""
    if not accept:
        return None
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        if media in (NDJSON_MEDIA_TYPE, NPZ_MEDIA_TYPE):
            return media
        if media in ("application/json", "*/*", "application/*"):
            return None
    return None


def check_streamable(settings: Settings, query: SearchQuery) -> None:
    """406 for a two-stage search; 422 for what bounds a streamed answer too (k, queries)."""
    if query.rerank:
        raise Problem(
            406,
            "Not acceptable",
            "two-stage answers are not streamed or archived (their candidates are bounded per "
            "request by RERANK_MAX_CANDIDATES and embedded in one call): ask for application/json",
        )
    if query.k > settings.max_k:
        raise invalid("k", f"must be ≤ {settings.max_k}")
    check_batch_size(len(query.vectors), query.field, settings.max_vectors_per_request)


# Bytes of hit points (hits × dim float32) one chunk's search holds: the index returns every
# hit's stored point beside its distance, so a chunk is bounded by this as well as by
# MAX_HITS_PER_REQUEST (at 200,000 hits of 385 dimensions those points alone were 0.3 GiB).
CHUNK_POINT_BYTES = 64 * 2**20


def chunks(settings: Settings, query: SearchQuery) -> list[SearchQuery]:
    """The query split in chunks of at most ``max_hits_per_request`` hits and
    ``CHUNK_POINT_BYTES`` of their points (the query's dimension + 1 standing for the gallery's
    lifted one; at least one query each), in order."""
    n = len(query.vectors)
    dim = (len(query.vectors[0]) if n else 1) + 1
    hits = min(settings.max_hits_per_request, max(1, CHUNK_POINT_BYTES // (4 * dim)))
    per = max(1, hits // max(query.k, 1))
    out = []
    for start in range(0, max(n, 1), per):
        part = slice(start, start + per)
        out.append(
            replace(
                query,
                vectors=_rows(query.vectors, part),
                old_vectors=None if query.old_vectors is None else _rows(query.old_vectors, part),
            )
        )
    return out


def _rows(rows: Any, part: slice) -> Any:
    return rows[part] if isinstance(rows, np.ndarray) else list(rows)[part]


def lines(first: int, results: list[list[dict[str, Any]]]) -> bytes:
    """One chunk's lines: queries numbered from ``first``."""
    return b"".join(
        json.dumps({"query": first + i, "hits": hits}, separators=(",", ":")).encode() + b"\n"
        for i, hits in enumerate(results)
    )


async def stream(
    first_results: list[list[dict[str, Any]]],
    rest: list[SearchQuery],
    search_chunk: Callable[[SearchQuery], Any],
    n_queries: int,
    k: int,
) -> AsyncIterator[bytes]:
    """The answer's lines: the first chunk (already searched), then each further chunk searched
    by ``search_chunk`` (an awaitable of its results) as the client reads."""
    yield lines(0, first_results)
    done = len(first_results)
    del first_results
    for part in rest:
        try:
            results = await search_chunk(part)
        except Exception as exc:  # the status line is sent: say it in the stream
            status = exc.status if isinstance(exc, Problem) else 503
            detail = exc.detail if isinstance(exc, Problem) else "the search failed mid-answer"
            log.warning("streamed search ended after %d of %d queries: %r", done, n_queries, exc)
            yield (
                json.dumps({"error": {"status": status, "detail": detail, "queries_sent": done}})
                + "\n"
            ).encode()
            return
        yield lines(done, results)
        done += len(results)
    yield (json.dumps({"done": True, "queries": done, "k": k}) + "\n").encode()
