"""Search a gallery with vectors of its own space or with a trained model's input features."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.arrays import as_matrix, check_batch_size, check_count
from app.core.errors import FieldError, conflict, invalid, invalid_fields, unavailable
from app.core.settings import Settings
from app.embedders.guard import EmbeddingGuards
from app.galleries.frames import frame_map, same_space
from app.galleries.models import Gallery
from app.galleries.service import check_texts, index_for
from app.migration.returned import DeferredTally, ReturnedTally
from app.models.service import BACKBONE, ModelCache, embed_features, get_model, resolve_modality
from app.search.schemas import SearchRequest
from app.vectors.engine import ATTACHED
from app.vectors.faiss.index_store import IndexStore
from app.vectors.points import lifted_points
from app.vectors.storage import storage_for


@dataclass(frozen=True)
class SearchQuery:
    """A search after parsing: rows from JSON (lists) or from a ``.npy`` body (an array)."""

    vectors: Sequence[Sequence[float]] | np.ndarray
    k: int
    model_id: str | None = None
    modality: str | None = None
    # What the rows are called in errors: "vectors" or "old_vectors" (old space), "features" (a
    # model's inputs).
    field: str = "vectors"
    # A transition search: the old model's vectors of the same queries (rows of ``vectors``).
    old_vectors: Sequence[Sequence[float]] | np.ndarray | None = None
    # A two-stage search: ``rerank`` set, ``rerank_depth`` None for the server's default; the
    # queries may come as ``texts`` (then ``vectors`` is empty) for the model's embedder.
    rerank: bool = False
    rerank_depth: int | None = None
    texts: Sequence[str] | None = None

    @classmethod
    def of(cls, request: SearchRequest) -> SearchQuery:
        if request.rerank is not None and request.model_id is None:
            raise invalid("rerank", "a two-stage search needs model_id (the new model)")
        if request.texts is not None:
            return cls.with_texts(request)
        query = cls.build(
            request.vectors,
            request.features,
            request.old_vectors,
            request.k,
            request.model_id,
            request.modality,
        )
        if request.rerank is None:
            return query
        return replace(query, rerank=True, rerank_depth=request.rerank.get("depth"))

    @classmethod
    def with_texts(cls, request: SearchRequest) -> SearchQuery:
        """Queries as text: a two-stage search through the model's embedder."""
        assert request.texts is not None
        if request.model_id is None or request.rerank is None:
            raise invalid("texts", "query texts need model_id and rerank (a two-stage search)")
        given = [n for n in ("vectors", "features") if getattr(request, n) is not None]
        if given:
            raise invalid(given[0], "give texts or vectors/features, not both")
        return cls(
            [],
            request.k,
            request.model_id,
            request.modality,
            "features",
            request.old_vectors,
            rerank=True,
            rerank_depth=request.rerank.get("depth"),
            texts=request.texts,
        )

    @classmethod
    def build(
        cls,
        vectors: Any,
        features: Any,
        old_vectors: Any,
        k: int,
        model_id: str | None,
        modality: str | None,
    ) -> SearchQuery:
        if vectors is not None and features is not None:
            raise invalid_fields(
                [
                    FieldError(f, "give vectors (old space) or features, not both")
                    for f in ("vectors", "features")
                ]
            )
        if model_id is None:
            if features is not None:
                raise invalid("features", "a model's inputs: give model_id too, or send vectors")
            if vectors is not None and old_vectors is not None:
                raise invalid("old_vectors", "without model_id, give vectors or old_vectors")
            if old_vectors is not None:
                return cls(old_vectors, k, None, modality, "old_vectors")
            if vectors is None:
                raise invalid("vectors", "required (or features together with model_id)")
            return cls(vectors, k, None, modality)
        if features is not None:
            return cls(features, k, model_id, modality, "features", old_vectors)
        if vectors is None:
            raise invalid("features", "required with model_id: the new backbone's features")
        # ``vectors`` with ``model_id``: the former spelling of features.
        return cls(vectors, k, model_id, modality, "vectors", old_vectors)


def _queries(
    session: Session,
    settings: Settings,
    cache: ModelCache,
    tenant_id: str,
    gallery: Gallery,
    request: SearchQuery,
) -> np.ndarray:
    """The queries as space components in the gallery's frame."""
    if request.model_id is None:
        if request.modality is not None:
            raise invalid("modality", "only applies together with model_id")
        vectors = as_matrix(
            request.vectors, request.field, dim=gallery.dim, max_dim=settings.max_dim
        )
        return lifted_points(gallery, vectors)
    row = get_model(session, tenant_id, request.model_id)
    to_gallery = frame_map(session, row, gallery)
    points, _ = embed_features(
        cache, settings, row, request.vectors, request.modality, request.field
    )
    return to_gallery(points)


def hit_scores(
    gallery: Gallery, queries: np.ndarray, points: np.ndarray, distances: np.ndarray
) -> np.ndarray:
    """The ``score`` of each hit (nq × k; larger is nearer, ranked like the distance).

    Cosine galleries: cos(q, x) of the query's point and the stored point, which has the stored
    vector's direction; all stored points share one radius, so this is decreasing in the
    distance. Otherwise the Lorentz inner product ⟨q,x⟩_L = −cosh(√c·d)/c."""
    if gallery.bound_model_id is None and gallery.metric == "cosine":
        queries = np.asarray(queries, dtype=np.float64)
        out = np.empty(points.shape[:2], dtype=np.float64)
        # In blocks of queries: a float64 copy of every hit's point (nq × k × d) held 0.6 GiB
        # for 200 queries × k = 1,000 (issue 45 item 6).
        per = max(1, SCORE_BLOCK_VALUES // max(points.shape[1] * points.shape[2], 1))
        for start in range(0, len(queries), per):
            part = slice(start, start + per)
            q = queries[part][:, None, :]
            x = points[part].astype(np.float64)
            norms = np.linalg.norm(q, axis=-1) * np.linalg.norm(x, axis=-1)
            dots = np.einsum("qkd,qkd->qk", np.broadcast_to(q, x.shape), x)
            # A zero vector (lifted to the origin) has no direction: its cosine is taken as 0.
            with np.errstate(invalid="ignore", divide="ignore"):
                out[part] = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)
        return out
    return _distance_scores(gallery, distances)


# Float64 values ``hit_scores`` copies at once (queries × k × dim): 32 MiB.
SCORE_BLOCK_VALUES = 2**22


def _distance_scores(gallery: Gallery, distances: np.ndarray) -> np.ndarray:
    """The Lorentz inner product ⟨q,x⟩_L = −cosh(√c·d)/c of each distance."""
    curv = gallery.lift_curv
    return -np.cosh(np.sqrt(curv) * distances) / curv


def _item_names(
    session: Session, gallery: Gallery, wanted: list[int]
) -> dict[int, tuple[str, str | None]]:
    return storage_for(session, gallery).names(session, gallery, wanted)


def _mixed_search(
    session: Session,
    settings: Settings,
    store: IndexStore,
    cache: ModelCache,
    tenant_id: str,
    gallery: Gallery,
    request: SearchQuery,
    queries: np.ndarray,
    tally: ReturnedTally | DeferredTally | None,
) -> list[list[dict[str, Any]]] | None:
    """A backbone model's search of a gallery holding items re-embedded for it (partial
    backfill, ``app.migration.mixed_search``); None when it holds none."""
    from app.migration import in_place, mixed_search

    row = get_model(session, tenant_id, request.model_id)
    if row.kind != BACKBONE or not same_space(row, gallery):
        return None
    modality = resolve_modality(row, request.modality)
    features = as_matrix(
        request.vectors, request.field, dim=int(row.input_dims[modality]), max_dim=settings.max_dim
    )
    # An attached collection: one search per vector place (Qdrant: named vector; Milvus:
    # collection), the same merge.
    lists = in_place.search_lists if gallery.vector_storage in ATTACHED else None
    found = mixed_search.mixed_search(
        session,
        store,
        cache,
        gallery,
        row,
        features,
        queries,
        request.k,
        overfetch=settings.search_overfetch,
        min_candidates=settings.search_min_candidates,
        transition=request.old_vectors is not None,
        lists=lists,
    )
    if found is None:
        return None
    ids, scores, distances, from_native = found
    if tally is not None:
        tally.record(gallery.id, ids)
    items = _item_names(session, gallery, sorted({int(i) for i in ids[ids >= 0]}))
    results = []
    for q in range(len(ids)):
        hits = []
        for vector_id, score, distance, native in zip(
            ids[q].tolist(),
            scores[q].tolist(),
            distances[q].tolist(),
            from_native[q].tolist(),
            strict=True,
        ):
            hit = _hit(items, vector_id, distance, score, "new" if native else "old")
            if hit is not None:
                hits.append(hit)
        results.append(hits)
    return results


def _hit(
    items: dict[int, tuple[str, str | None]],
    vector_id: int,
    distance: float,
    score: float,
    space: str | None,
) -> dict[str, Any] | None:
    """One hit as answered; None for a padded slot or an item deleted since the search read
    it (skipped)."""
    if vector_id < 0 or vector_id not in items:
        return None
    item_id, label = items[vector_id]
    hit: dict[str, Any] = {"id": item_id, "distance": distance, "score": score}
    if space is not None:
        hit["space"] = space
    if label is not None:
        hit["label"] = label
    return hit


def _transition_queries(
    session: Session, settings: Settings, tenant_id: str, gallery: Gallery, request: SearchQuery
) -> np.ndarray:
    """A transition search's old-model queries as points of the gallery's frame, after checking
    the request as a whole (nothing is searched when any part is wrong)."""
    assert request.old_vectors is not None and request.model_id is not None
    check_count(len(request.old_vectors), "old_vectors", len(request.vectors), request.field)
    old = as_matrix(request.old_vectors, "old_vectors", dim=gallery.dim, max_dim=settings.max_dim)
    row = get_model(session, tenant_id, request.model_id)
    if row.kind != BACKBONE or not same_space(row, gallery):
        raise conflict(
            f"a transition search needs a backbone model of this gallery's space; model "
            f"{row.id} is not one (send features alone for its own search)"
        )
    modality = resolve_modality(row, request.modality)
    as_matrix(
        request.vectors, request.field, dim=int(row.input_dims[modality]), max_dim=settings.max_dim
    )
    return lifted_points(gallery, old)


def bridged_warning(session: Session, tenant_id: str, request: SearchQuery) -> str | None:
    """A warning for a search through a backbone model with its features alone (no
    ``old_vectors``: the items not re-embedded are scored through the bridge) when the model's
    upgrade did not recommend the bridge — on its held-out data the bridge was not shown to beat
    keeping the old model (issue 44: the default served worse than staying) — or recommended it
    on class search alone (labels, no query log), which says nothing of queries looking for
    their own documents (on the public nouns such a bridge finds them less often than the old
    model). None otherwise."""
    if request.model_id is None or request.old_vectors is not None or request.rerank:
        return None
    from app.jobs.models import UpgradeJob

    row = get_model(session, tenant_id, request.model_id)
    if row.kind != BACKBONE or row.upgrade_id is None:
        return None
    report = session.scalar(select(UpgradeJob.report).where(UpgradeJob.id == row.upgrade_id))
    verdict = (report or {}).get("recommendation") or {}
    action = verdict.get("action")
    send_old = (
        "Send the old model's query vectors too (old_vectors, the CLI's --old-queries: a "
        "transition search, exactly the old model's own while nothing is re-embedded), or "
        "rerank (a two-stage search)"
    )
    if action == "bridge" and (verdict.get("metric") or {}).get("view") == "class":
        return (
            f"model {row.id}'s upgrade verdict 'bridge' was judged on class search (an item's "
            "neighbours sharing its label); query → document search through the bridge was not "
            f"measured. For queries that look for their own documents: {send_old}"
        )
    if action in (None, "bridge"):
        return None
    return (
        f"model {row.id}'s upgrade verdict is {action!r}, not 'bridge': on its held-out data "
        f"searching the old gallery through the bridge was not shown to beat the old model. "
        f"{send_old}"
    )


def check_k(settings: Settings, k: int, n_queries: int) -> None:
    """422 naming ``k`` before any work: above ``max_k``, or queries × k above
    ``max_hits_per_request`` (an answer's size and the memory behind it grow with both)."""
    if k > settings.max_k:
        raise invalid("k", f"must be ≤ {settings.max_k}")
    if n_queries * k > settings.max_hits_per_request:
        raise invalid(
            "k",
            f"{n_queries} queries × k {k} = {n_queries * k} hits exceeds "
            f"{settings.max_hits_per_request} per request (MAX_HITS_PER_REQUEST): send fewer "
            "queries per request or a smaller k",
        )


def search_gallery(
    session: Session,
    settings: Settings,
    store: IndexStore,
    cache: ModelCache,
    tenant_id: str,
    gallery: Gallery,
    request: SearchQuery | SearchRequest,
    tally: ReturnedTally | DeferredTally | None = None,
) -> list[list[dict[str, Any]]]:
    """The hits of every query row; ``tally`` (the service's) records what was returned."""
    if isinstance(request, SearchRequest):
        request = SearchQuery.of(request)
    check_k(settings, request.k, len(request.vectors))
    check_batch_size(len(request.vectors), request.field, settings.max_vectors_per_request)
    transition = request.old_vectors is not None
    if transition:
        queries = _transition_queries(session, settings, tenant_id, gallery, request)
    else:
        queries = _queries(session, settings, cache, tenant_id, gallery, request)
    if request.model_id is not None:
        mixed = _mixed_search(
            session, settings, store, cache, tenant_id, gallery, request, queries, tally
        )
        if mixed is not None:
            return mixed
    # Nothing re-embedded: a transition search is the old model's own search, exactly.
    return _plain_search(session, settings, store, gallery, queries, request.k, transition, tally)


def _plain_search(
    session: Session,
    settings: Settings,
    store: IndexStore,
    gallery: Gallery,
    queries: np.ndarray,
    k: int,
    old_space: bool,
    tally: ReturnedTally | DeferredTally | None,
) -> list[list[dict[str, Any]]]:
    index = index_for(session, store, gallery)
    ids, distances, points = index.search_with_points(
        queries,
        k,
        overfetch=settings.search_overfetch,
        min_candidates=settings.search_min_candidates,
    )
    if tally is not None:
        tally.record(gallery.id, ids)
    scores = hit_scores(gallery, queries, points, distances)
    items = _item_names(session, gallery, sorted({int(i) for i in ids[ids >= 0]}))
    results = []
    for row_ids, row_dist, row_scores in zip(
        ids.tolist(), distances.tolist(), scores.tolist(), strict=True
    ):
        # A vector deleted between the index read and this lookup is simply skipped.
        space = "old" if old_space else None
        results.append(
            [
                hit
                for faiss_id, distance, score in zip(row_ids, row_dist, row_scores, strict=True)
                if (hit := _hit(items, faiss_id, distance, score, space))
            ]
        )
    return results


def _stage_one(
    session: Session,
    settings: Settings,
    store: IndexStore,
    gallery: Gallery,
    stage: np.ndarray,
    depth: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A two-stage search's candidates: (ids, distances, old scores), nq × depth each, nearest
    first, −1 / inf padded.

    The gallery's in-memory index answers its candidate search (``search_candidates``): the
    float32 scan's best ``depth`` rows, re-scored exactly, with no over-fetch beyond them for an
    exact re-rank — the new model re-scores the candidates, so only their set matters (at depth
    200 that over-fetch re-ranked 800 rows a query, most of a warm search's time). The old score
    of each candidate (its cosine, as ``hit_scores``) comes from the same re-score. An engine
    without it (Milvus) answers its exact search at the depth."""
    index = index_for(session, store, gallery)
    cosine = gallery.bound_model_id is None and gallery.metric == "cosine"
    search_candidates = getattr(index, "search_candidates", None)
    if search_candidates is None:
        ids, distances, points = index.search_with_points(
            stage,
            depth,
            overfetch=settings.search_overfetch,
            min_candidates=settings.search_min_candidates,
        )
        return ids, distances, hit_scores(gallery, stage, points, distances)
    found = search_candidates(stage, depth, cosines=cosine)
    if found.cosines is not None:
        return found.ids, found.distances, found.cosines
    return found.ids, found.distances, _distance_scores(gallery, found.distances)


def _candidate_names(
    session: Session, gallery: Gallery, model_id: str, candidates: np.ndarray
) -> dict[int, tuple[str, str | None]]:
    """The names ``two_stage.new_vectors`` reads: of the candidates without a new vector of the
    model, those it may embed: a warm search's candidates all have one, and nothing is looked
    up (every candidate was: 35,000 lookups at batch 256 and depth 200, for the hits' 2,560).
    The hits' names are looked up once ranked. An attached collection's path reads every
    candidate's item id."""
    from app.search.two_stage import NewVectors

    if gallery.vector_storage in ATTACHED:
        return _item_names(session, gallery, candidates.tolist())
    have = NewVectors.stored(session, gallery.id, model_id)
    return _item_names(session, gallery, candidates[have.positions(candidates) < 0].tolist())


def search_two_stage(
    session: Session,
    settings: Settings,
    store: IndexStore,
    cache: ModelCache,
    guards: EmbeddingGuards,
    tenant_id: str,
    gallery: Gallery,
    request: SearchQuery,
    tally: ReturnedTally | DeferredTally | None = None,
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """A two-stage search (``app.search.two_stage``): (the hits of every query, how it went).
    Every part of the request is checked before anything is searched or embedded; an embedder
    that fails turns the answer into the single-stage search (``degraded`` says why)."""
    from app.migration.reembed import backbone_for
    from app.search import ranking, two_stage

    texts = request.texts
    n = len(texts) if texts is not None else len(request.vectors)
    check_k(settings, request.k, n)
    check_batch_size(
        n, "texts" if texts is not None else request.field, settings.max_vectors_per_request
    )
    if texts is not None:
        check_texts(texts, n, settings.max_text_length)
    depth = two_stage.check_depth(settings, request.rerank_depth, n, request.k)
    two_stage.refuse_attached(gallery, ATTACHED)
    assert request.model_id is not None
    row = backbone_for(session, tenant_id, gallery, request.model_id)
    modality = resolve_modality(row, request.modality)
    info: dict[str, Any] = {
        "depth": depth,
        "candidates": 0,
        "embedded": 0,
        "scored_new": 0,
        "fusion_weight": 0.0,
        "degraded": None,
    }
    if texts is not None:
        spec = two_stage.embedder_of(session, row)
        if spec is None:
            raise conflict(
                f"model {row.id} has no embedder to embed query texts: PATCH /v1/models/{row.id} "
                "with an embedder_id, or send features"
            )
        if request.old_vectors is not None:
            check_count(len(request.old_vectors), "old_vectors", n, "texts")
            as_matrix(request.old_vectors, "old_vectors", dim=gallery.dim, max_dim=settings.max_dim)
        session.commit()  # no pooled connection waits on the embedder
        try:
            features = two_stage.guarded_embed(
                settings, guards, tenant_id, spec, list(texts), "query"
            )
        except two_stage.Degraded as exc:
            if request.old_vectors is None:
                raise unavailable(
                    f"the model's embedder is unavailable ({exc.reason}) and the queries came as "
                    "text only; retry, or send features or old_vectors",
                    int(settings.embedder_circuit_open_s),
                ) from exc
            info["degraded"] = exc.reason
            old = as_matrix(
                request.old_vectors, "old_vectors", dim=gallery.dim, max_dim=settings.max_dim
            )
            plain = _plain_search(
                session,
                settings,
                store,
                gallery,
                lifted_points(gallery, old),
                request.k,
                True,
                tally,
            )
            return plain, info
        request = replace(request, vectors=features, field="features", texts=None)
    if request.old_vectors is not None:
        stage = _transition_queries(session, settings, tenant_id, gallery, request)
    else:
        stage = _queries(session, settings, cache, tenant_id, gallery, request)
    features = as_matrix(
        request.vectors, request.field, dim=int(row.input_dims[modality]), max_dim=settings.max_dim
    )
    ids, distances, old_scores = _stage_one(session, settings, store, gallery, stage, depth)
    candidates = np.unique(ids[ids >= 0])
    names = _candidate_names(session, gallery, row.id, candidates)
    info["candidates"] = int(candidates.size)
    try:
        vectors, embedded = two_stage.new_vectors(
            session, settings, store, guards, tenant_id, gallery, row, candidates, names
        )
    except two_stage.Degraded as exc:
        info["degraded"] = exc.reason
        single = replace(request, rerank=False)
        return search_gallery(
            session, settings, store, cache, tenant_id, gallery, single, tally
        ), info
    info["embedded"] = embedded
    info["scored_new"] = int((vectors.positions(candidates) >= 0).sum())
    # Fused with the old score only where that score is the old model's own cosine: the query's
    # old vector against a cosine gallery (a bridged query's old score is another quantity).
    fusion = None
    if request.old_vectors is not None and gallery.bound_model_id is None:
        fusion = two_stage.model_fusion(session, row) if gallery.metric == "cosine" else None
    info["fusion_weight"] = 0.0 if fusion is None else fusion.weight
    ranked = ranking.ranked(ids, distances, old_scores, features, vectors, request.k, fusion)
    # The names of the hits (those of the candidates embedded here are known already).
    hit_ids = {h[0] for hits in ranked for h in hits}.difference(names)
    names.update(_item_names(session, gallery, sorted(hit_ids)))
    if tally is not None:
        returned = np.full((len(ranked), request.k), -1, dtype=np.int64)
        for q, hits in enumerate(ranked):
            returned[q, : len(hits)] = [h[0] for h in hits]
        tally.record(gallery.id, returned)
    results = [
        [
            hit
            for vector_id, distance, score, new in hits
            if (hit := _hit(names, vector_id, distance, score, "new" if new else "old"))
        ]
        for hits in ranked
    ]
    return results, info
