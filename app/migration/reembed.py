"""Partial backfill in the service: store a new backbone's features for items already in a gallery,
plan what to re-embed next, and count progress (the mixed search that uses them:
``app.migration.mixed_search``; an attached Qdrant collection's items: ``app.migration.in_place``).

The mixed search and the plan are in ``app.ml.backfill`` (why they are built as they are is in its
docstring). Here: validation, all-or-nothing writes committed before they are acknowledged (the
same order as vector upserts), the per-model fit (computed once from the upgrade's held-out data
and stored), and an in-memory copy of each (gallery, model)'s re-embedded features checked against
what the database holds (``reembedded_features``), so a stale copy is never used.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from sqlalchemy import delete, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.core.arrays import as_matrix, check_batch_size, check_count, check_ids
from app.core.db import utcnow
from app.core.errors import FieldError, conflict, invalid, invalid_fields
from app.core.settings import Settings
from app.galleries.frames import same_space
from app.galleries.models import Gallery
from app.galleries.service import IN_CHUNK, _lock_gallery, gallery_points, item_texts
from app.migration.models import BackfillFit
from app.migration.traffic import read_signals, returned_summary, traffic_choice
from app.ml.backfill.mixed import (
    CALIBRATION,
    pick_reference,
    unit_rows,
)
from app.ml.backfill.plan import PlannerFit, expected_at, fit_planner, plan_order, plan_priority
from app.ml.backfill.traffic import (
    expected_note,
    gain_rank,
    no_better_warning,
    value_order,
    versus_random,
)
from app.ml.evaluation.retrieval import json_safe
from app.ml.geometry.lorentz import uncertainty as norm_uncertainty
from app.ml.upgrade.fit_view import build_fit_view
from app.models.models import TrainedModel
from app.models.service import BACKBONE, ModelCache, get_model, lock_model, resolve_modality
from app.vectors.faiss.index_store import IndexStore
from app.vectors.points import lift_of
from app.vectors.storage import storage_for
from app.vectors.tables import ReembeddedVector

# (gallery, model) feature copies kept in memory (LRU).
FEATURE_CACHE_SIZE = 8
# Per-model fits kept in memory (LRU): a fit is stored once and never changes (it goes only with
# its model, whose id is never reused), so its row and reference documents (an .npz of up to
# REFERENCE_SIZE items, both models' vectors) need not be read and decoded again every search.
FIT_CACHE_SIZE = 16


def backbone_for(session: Session, tenant_id: str, gallery: Gallery, model_id: str):
    """The model, if it is a backbone model trained for this gallery's space; else 409."""
    row = get_model(session, tenant_id, model_id)
    if row.kind != BACKBONE or not same_space(row, gallery):
        raise conflict(
            f"model {row.id} was not trained for the space of gallery {gallery.id} "
            f"({gallery.model_name!r}, dim {gallery.dim}): re-embedded features need a backbone "
            "model trained against that space"
        )
    return row


def store_reembedded(
    session: Session,
    settings: Settings,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    ids: Sequence[Any],
    features: Any,
) -> tuple[int, int]:
    """Store ``features`` (the model's backbone inputs) for items the gallery holds; all or
    nothing. Returns (stored, re-embedded items of this model in the gallery)."""
    ids, matrix = checked_features(settings, row, ids, features)
    blobs = [np.ascontiguousarray(r, dtype="<f4").tobytes() for r in matrix]
    with locked_upload(session, store, gallery, row) as gallery:
        existing = {
            item_id: vector_id
            for item_id, (vector_id, _) in storage_for(session, gallery)
            .lookup(session, gallery, ids)
            .items()
        }
        missing = [n for n, item_id in enumerate(ids) if item_id not in existing]
        if missing:
            raise invalid_fields(
                [
                    FieldError(f"ids[{n}]", f"{ids[n]!r} is not in this gallery")
                    for n in missing[:20]
                ]
            )
        replace_rows(session, gallery, row.id, [existing[i] for i in ids], blobs)
        session.commit()
    return len(ids), reembedded_count(session, gallery.id, row.id)


@dataclass(frozen=True)
class EmbeddedTexts:
    """What the model's embedder returned for some items' texts, as a two-stage search or a
    re-embed job hands it to be stored (``store_embedded``, or in place for an attached
    collection, ``app.migration.in_place.texts.store_embedded_in_place``): ``names`` maps each
    row's internal id (in ``matrix`` order) to its item id, ``texts`` to the text that was
    embedded, and ``matrix`` holds the embedder's vectors, one row per name."""

    names: dict[int, str]
    texts: dict[int, str]
    matrix: np.ndarray


def store_embedded(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    embedded: EmbeddedTexts,
) -> int:
    """Store features a search or a re-embed job embedded as re-embedded items of ``row``.
    Under the gallery's locks: an item deleted, or whose text changed, since it was read is
    skipped (its new content has no features yet), one that another search stored meanwhile is
    left as it is. Committed; returns how many were stored."""
    names, texts, matrix = embedded.names, embedded.texts, embedded.matrix
    vector_ids = list(names)
    blobs = {
        v: np.ascontiguousarray(r, dtype="<f4").tobytes()
        for v, r in zip(vector_ids, matrix, strict=True)
    }
    with locked_upload(session, store, gallery, row) as gallery:
        before = _written(session, gallery.id)
        current = storage_for(session, gallery).lookup(session, gallery, list(names.values()))
        now_texts = item_texts(session, gallery.id, vector_ids)
        alive = [
            v
            for v in vector_ids
            if current.get(names[v], (None,))[0] == v and now_texts.get(v) == texts[v]
        ]
        taken = _reembedded_among(session, gallery.id, row.id, alive)
        fresh = [v for v in alive if v not in taken]
        after = None
        if fresh:
            replace_rows(session, gallery, row.id, fresh, [blobs[v] for v in fresh])
            session.flush()
            after = _written(session, gallery.id)
        session.commit()
    if after is not None:
        at = {v: n for n, v in enumerate(vector_ids)}
        _extend_copy(
            gallery.id,
            row.id,
            before,
            after,
            fresh,
            np.asarray(matrix, dtype=np.float32)[[at[v] for v in fresh]],
        )
    return len(fresh)


def _reembedded_among(
    session: Session, gallery_id: str, model_id: str, vector_ids: Sequence[int]
) -> set[int]:
    """Which of ``vector_ids`` are re-embedded for the model: a lookup of those alone, in
    chunks (a search's few hundred candidates; reading every re-embedded id of the gallery was
    O(gallery) per lazily embedding search)."""
    out: set[int] = set()
    for start in range(0, len(vector_ids), IN_CHUNK):
        out.update(
            session.scalars(
                select(ReembeddedVector.vector_id).where(
                    ReembeddedVector.gallery_id == gallery_id,
                    ReembeddedVector.model_id == model_id,
                    ReembeddedVector.vector_id.in_(vector_ids[start : start + IN_CHUNK]),
                )
            )
        )
    return out


@contextmanager
def locked_upload(
    session: Session, store: IndexStore, gallery: Gallery, row: TrainedModel
) -> Iterator[Gallery]:
    """The gallery re-read under its locks, for one upload of items re-embedded for ``row``.
    The model's row is locked too (shared): a delete of the model either sees the upload's
    rows and refuses, or has committed first and the upload answers 404 — never drops an
    acknowledged batch."""
    with store.lock(gallery.id):
        locked = _lock_gallery(session, gallery)
        lock_model(session, row.id, shared=True)
        yield locked


def checked_features(
    settings: Settings, row: TrainedModel, ids: Sequence[Any], features: Any
) -> tuple[list[str], np.ndarray]:
    """(ids, features matrix) of an upload of re-embedded items, or 422 naming the field."""
    check_batch_size(len(ids), "ids", settings.max_vectors_per_request)
    ids = check_ids(ids, "ids", max_length=settings.max_id_length)
    if features is None:
        raise invalid("features", "required: the new backbone's features of each item")
    check_count(len(features), "features", len(ids))
    modality = resolve_modality(row, None, "model_id")
    matrix = as_matrix(
        features, "features", dim=int(row.input_dims[modality]), max_dim=settings.max_dim
    )
    return ids, matrix


def replace_rows(
    session: Session,
    gallery: Gallery,
    model_id: str,
    vector_ids: Sequence[int],
    blobs: Sequence[bytes | None],
) -> None:
    """The model's rows of these items, replaced (staged; the caller commits under the
    gallery's lock). A blob of None: the features live in the attached collection."""
    for start in range(0, len(vector_ids), IN_CHUNK):
        session.execute(
            delete(ReembeddedVector).where(
                # The gallery's rows only: one model may serve several galleries of its space,
                # whose internal ids overlap.
                ReembeddedVector.gallery_id == gallery.id,
                ReembeddedVector.model_id == model_id,
                ReembeddedVector.vector_id.in_(vector_ids[start : start + IN_CHUNK]),
            )
        )
    now = utcnow()
    if vector_ids:
        session.execute(
            insert(ReembeddedVector),
            [
                {
                    "gallery_id": gallery.id,
                    "model_id": model_id,
                    "vector_id": v,
                    "features": b,
                    "updated_at": now,
                }
                for v, b in zip(vector_ids, blobs, strict=True)
            ],
        )
    gallery.updated_at = now


def reembedded_count(session: Session, gallery_id: str, model_id: str) -> int:
    return int(
        session.scalar(
            select(func.count()).where(
                ReembeddedVector.gallery_id == gallery_id, ReembeddedVector.model_id == model_id
            )
        )
        or 0
    )


def reembedded_ids(session: Session, gallery_id: str, model_id: str) -> np.ndarray:
    """Internal ids of the gallery's items re-embedded for the model (wherever the features
    live: here, or in an attached collection)."""
    rows = session.scalars(
        select(ReembeddedVector.vector_id).where(
            ReembeddedVector.gallery_id == gallery_id, ReembeddedVector.model_id == model_id
        )
    )
    return np.fromiter(rows, dtype=np.int64)


# -- in-memory features ------------------------------------------------------------------------


@dataclass(frozen=True)
class _FeatureCopy:
    """One (gallery, model)'s re-embedded features in memory, and what they were read as: the
    gallery's ``updated_at`` when last checked, and (PostgreSQL) the rows' count and largest id.
    ``sorted_ids`` and ``order`` (``ids[order]``) are its ids sorted, made once per read: a
    two-stage search looks its candidates up by id, and sorting the ids and reordering the
    features on every search (a copy of 300 MB at 100k items of 768 dimensions) was most of
    what a search whose candidates were all embedded paid (issue 43, speed target).

    ``features`` is the first ``len(ids)`` rows of ``buffer``, which has room for more: the
    items a two-stage search embeds are appended in place (``_extend_copy``) instead of the
    whole copy being read again from the database after every such search. Rows of the buffer
    beyond a copy's length are written only while that copy is the cached one, and a copy is
    only ever replaced by a longer one on the same buffer or one on a new buffer, so no copy a
    search still holds ever changes."""

    written: Any
    rows: tuple[int, int] | None
    ids: np.ndarray
    features: np.ndarray
    sorted_ids: np.ndarray
    order: np.ndarray
    buffer: np.ndarray


_features: OrderedDict[tuple[str, str], _FeatureCopy] = OrderedDict()
_features_lock = threading.Lock()
_fits: OrderedDict[str, tuple[PlannerFit, np.ndarray, np.ndarray]] = OrderedDict()
_fits_lock = threading.Lock()


def reembedded_features(
    session: Session, gallery_id: str, model_id: str
) -> tuple[np.ndarray, np.ndarray]:
    """(vector ids, unit-normalised features) of the re-embedded items, as committed (the
    in-memory copy of ``_feature_copy``; rows in the order they were written)."""
    copy = _feature_copy(session, gallery_id, model_id)
    return copy.ids, copy.features


def reembedded_by_id(
    session: Session, gallery_id: str, model_id: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted vector ids, the row of each in the features, unit-normalised features) of the
    re-embedded items, as committed: ``reembedded_features`` with the ids' sort kept with the
    copy, so that a lookup by id costs no sort and no copy of the features per call."""
    copy = _feature_copy(session, gallery_id, model_id)
    return copy.sorted_ids, copy.order, copy.features


def _feature_copy(session: Session, gallery_id: str, model_id: str) -> _FeatureCopy:
    """The (gallery, model)'s re-embedded features in memory, as committed.

    Kept in memory per (gallery, model). Every write of a gallery's items or of their
    re-embedded rows sets the gallery's ``updated_at`` under its lock: while it is unchanged the
    copy is current (one primary-key read per search). After a write, PostgreSQL's rows with the
    same count and largest id are the same rows (its sequence never hands an id out twice: the
    write was a plain vector upload), and the copy is kept; SQLite gives a new row the largest
    id in use + 1, so a rewritten or deleted last row's id comes back with other features, and
    there the copy is read again."""
    key = (gallery_id, model_id)
    written = _written(session, gallery_id)
    with _features_lock:
        cached = _features.get(key)
        if cached is not None and cached.written == written:
            _features.move_to_end(key)
            return cached
    rows = None
    if session.get_bind().dialect.name != "sqlite":
        count, last = session.execute(
            select(func.count(), func.max(ReembeddedVector.id)).where(
                ReembeddedVector.gallery_id == gallery_id, ReembeddedVector.model_id == model_id
            )
        ).one()
        rows = (int(count), int(last or 0))
        if cached is not None and cached.rows == rows:
            with _features_lock:
                _features[key] = replace(cached, written=written)
            return cached
    ids: list[int] = []
    chunks: list[bytes] = []
    for vector_id, blob in session.execute(
        select(ReembeddedVector.vector_id, ReembeddedVector.features)
        .where(ReembeddedVector.gallery_id == gallery_id, ReembeddedVector.model_id == model_id)
        .order_by(ReembeddedVector.id)
        .execution_options(yield_per=5000)
    ):
        ids.append(vector_id)
        chunks.append(blob)
    dim = len(chunks[0]) // 4 if chunks else 0
    matrix = np.frombuffer(b"".join(chunks), dtype="<f4").reshape(len(ids), dim)
    del chunks
    buffer = np.empty((len(ids) + _room(len(ids)), dim), dtype=np.float32)
    # ``unit_rows`` written straight into the buffer: no third whole copy while reading.
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.divide(matrix, np.maximum(norms, 1e-12), out=buffer[: len(ids)])
    vector_ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(vector_ids, kind="stable")
    copy = _FeatureCopy(
        written, rows, vector_ids, buffer[: len(ids)], vector_ids[order], order, buffer
    )
    with _features_lock:
        _features[key] = copy
        while len(_features) > FEATURE_CACHE_SIZE:
            _features.popitem(last=False)
    return copy


def _written(session: Session, gallery_id: str) -> Any:
    """The gallery's ``updated_at`` as the database holds it: what a copy is labelled with."""
    return session.scalar(select(Gallery.updated_at).where(Gallery.id == gallery_id))


def _room(n: int) -> int:
    """Rows of room a copy of ``n`` rows gets for items appended later: an eighth more (at
    least 256, a search's depth), so that a reallocation, which copies every row, comes once
    per n/8 items embedded rather than with every search that embeds."""
    return max(256, n // 8)


def _extend_copy(
    gallery_id: str,
    model_id: str,
    before: Any,
    after: Any,
    vector_ids: Sequence[int],
    features: np.ndarray,
) -> None:
    """The cached copy, labelled ``before``, with the rows a write added appended and labelled
    ``after``: the write (``store_embedded``) held the gallery's locks from reading ``before``
    to committing ``after`` and only added these items, so the result is exactly what a read
    at ``after`` would give. Where the cached copy is not the one labelled ``before`` (none, or
    another write came between), nothing is done: the next lookup reads the rows again."""
    key = (gallery_id, model_id)
    if after == before:
        # The write's timestamp equals the one before it (a clock that did not advance): no
        # label tells the two states apart, so no copy of either may be kept.
        with _features_lock:
            _features.pop(key, None)
        return
    new_ids = np.asarray(vector_ids, dtype=np.int64)
    rows = unit_rows(features)
    with _features_lock:
        cached = _features.get(key)
        if cached is None or cached.written != before:
            return
        n, m = len(cached.ids), len(new_ids)
        sort = np.argsort(new_ids, kind="stable")
        at = np.searchsorted(cached.sorted_ids, new_ids[sort])
        clash = n > 0 and bool(np.any(cached.sorted_ids[np.minimum(at, n - 1)] == new_ids[sort]))
        if clash or (n > 0 and cached.features.shape[1] != rows.shape[1]):
            # An id the copy already holds: not the state this write started from. Dropped,
            # so that the next lookup reads the rows as committed.
            del _features[key]
            return
        buffer = cached.buffer
        if buffer.shape[0] < n + m or buffer.shape[1] != rows.shape[1]:
            buffer = np.empty((n + m + _room(n + m), rows.shape[1]), dtype=np.float32)
            if n:  # an empty copy has no dimension yet (0 columns)
                buffer[:n] = cached.features
        buffer[n : n + m] = rows
        _features[key] = _FeatureCopy(
            after,
            None,  # PostgreSQL's (count, largest id) of the rows are unknown here: read anew
            np.concatenate([cached.ids, new_ids]),
            buffer[: n + m],
            np.insert(cached.sorted_ids, at, new_ids[sort]),
            np.insert(cached.order, at, n + sort),
            buffer,
        )
        _features.move_to_end(key)


# -- the per-model fit --------------------------------------------------------------------------


def _upgrade_inputs(session: Session, row: TrainedModel):
    from app.datasets.models import Dataset
    from app.jobs.models import UpgradeJob
    from app.ml.upgrade.run import split_for_evaluation, split_queries
    from app.upgrades.backbone import load_inputs

    job = session.get(UpgradeJob, row.upgrade_id) if row.upgrade_id else None
    dataset = session.get(Dataset, job.dataset_id) if job and job.dataset_id else None
    gallery = session.get(Gallery, job.gallery_id) if job and job.gallery_id else None
    if job is None or dataset is None or gallery is None:
        return None
    data, _ = load_inputs(session, dataset, gallery)
    _, eval_idx = split_for_evaluation(len(data), job.eval_fraction, job.seed)
    _, eval_q = split_queries(data.queries, eval_idx, job.eval_fraction, job.seed)
    return data, lift_of(gallery), eval_idx, eval_q, job.seed


def backfill_fit(
    session: Session, cache: ModelCache, row: TrainedModel
) -> tuple[PlannerFit, np.ndarray, np.ndarray]:
    """(planner, reference new features, reference old vectors) of ``row``: stored, or fitted
    now from its upgrade's held-out data and stored. 409 when that data is gone."""
    with _fits_lock:
        cached = _fits.get(row.id)
        if cached is not None:
            _fits.move_to_end(row.id)
            return cached
    stored = session.get(BackfillFit, row.id)
    if stored is None:
        inputs = _upgrade_inputs(session, row)
        if inputs is None:
            raise conflict(
                f"model {row.id}'s upgrade data (its job and dataset) is gone: the backfill plan "
                "is learned from the upgrade's held-out part"
            )
        data, lift, eval_idx, eval_q, seed = inputs
        # End the read transaction before the fit (minutes on a large upgrade): an idle open
        # transaction would hold a connection, and PostgreSQL ends it after
        # PG_IDLE_IN_TRANSACTION_TIMEOUT_MS. Loaded rows stay usable (expire_on_commit=False).
        session.commit()
        try:
            fit = fit_planner(
                build_fit_view(cache.load(row), data, lift, eval_idx, eval_q, seed), seed
            )
        except ValueError as exc:
            raise conflict(f"model {row.id}: {exc}") from exc
        reference = pick_reference(len(data), seed)
        buf = io.BytesIO()
        np.savez(
            buf,
            new=data.new_features[reference],
            old=data.old_vectors[reference],
            allow_pickle=False,
        )
        # JSON has no NaN (a constant held-out gain gives one): PostgreSQL refused the row and
        # the plan answered 500. Stored as null, which reads back as NaN where it is a number.
        stored = BackfillFit(
            model_id=row.id, fit=json_safe(fit.to_dict()), reference=buf.getvalue()
        )
        session.add(stored)
        try:
            session.commit()
        except IntegrityError:  # another request stored it first: use theirs
            session.rollback()
            stored = session.get(BackfillFit, row.id)
    with np.load(io.BytesIO(stored.reference), allow_pickle=False) as f:
        new, old = f["new"], f["old"]
    out = (PlannerFit.from_dict(stored.fit), new, old)
    with _fits_lock:
        _fits[row.id] = out
        while len(_fits) > FIT_CACHE_SIZE:
            _fits.popitem(last=False)
    return out


# -- the plan -------------------------------------------------------------------------------------


def plan(
    session: Session,
    store: IndexStore,
    cache: ModelCache,
    gallery: Gallery,
    row: TrainedModel,
    fraction: float | None,
    count: int | None,
) -> dict[str, Any]:
    """The next items to re-embed, most valuable first, and the expected quality curve.

    Most valuable: by the learned estimator alone, or, when the gallery has access counts, by
    expected traffic × expected gain (``app.ml.backfill.traffic.value_order``; the traffic is the
    counts, with the search-returned tally or the neighbourhood of clicked items where their
    validation on held-out clicks picks them, ``app.ml.backfill.traffic_model``; the gain only
    breaks ties when the fit's cross-fitted validation finds it no better than random). The
    answer names the signals used, compares the learned order with random (``vs_random``, from
    the stored validation curves), warns when it is no better, and explains a falling curve."""
    fit, _, _ = backfill_fit(session, cache, row)
    vector_ids = reembedded_ids(session, gallery.id, row.id)
    all_ids, points = gallery_points(session, store, gallery)
    done = np.isin(all_ids, vector_ids)
    total = len(all_ids)
    if count is None:
        count = max(0, round(fraction * total) - int(done.sum()))
    uncertainty = None
    if fit.estimator == "uncertainty":
        uncertainty = norm_uncertainty(
            torch.as_tensor(points, dtype=torch.float64), gallery.lift_curv
        )
    priority = plan_priority(fit, points, uncertainty)
    planned = min(1.0, (int(done.sum()) + count) / total) if total else 0.0
    compared = versus_random(fit.validation, planned)
    signals = read_signals(session, store, gallery, all_ids, points)
    clicks = signals.clicks
    choice = traffic_choice(signals, done, count, gain_rank(priority))
    if choice is None:
        order = plan_order(priority, done)[:count]
    else:
        gain_validated = compared is None or compared["better"]
        order = value_order(priority, choice.estimate, gain_validated, done)[:count]
    chosen = all_ids[order].tolist()
    names = {
        vector_id: item_id
        for vector_id, (item_id, _) in storage_for(session, gallery)
        .names(session, gallery, chosen)
        .items()
    }
    ids = [names[i] for i in chosen if i in names]
    after = (int(done.sum()) + len(ids)) / total if total else 0.0
    expected = expected_at(fit, after)
    traffic = None
    if clicks is not None:
        covered = done.copy()
        covered[order] = True
        traffic = {
            "counted_items": int((clicks > 0).sum()),
            "total": int(clicks.sum()),
            "covered_after": float(clicks[covered].sum() / clicks.sum()),
        }
        if choice is not None:
            traffic["model"] = {"chosen": choice.name, **choice.report}
    return {
        "model_id": row.id,
        "ids": ids,
        "estimator": fit.estimator,
        "signals": ([] if choice is None else choice.signals) + [fit.estimator],
        "access": traffic,
        "search_returned": returned_summary(signals, choice),
        "warning": None if compared is None else no_better_warning(compared, clicks is not None),
        "view": fit.view,
        "reembedded": int(done.sum()),
        "total": total,
        "fraction_after": after,
        "expected": expected,
        "expected_note": expected_note(expected, int(fit.validation.get("queries") or 0)),
        "validation": {
            **{
                key: fit.validation.get(key)
                for key in (
                    "view",
                    "held_out_items",
                    "queries",
                    "gain_correlation",
                    "area",
                    "chosen",
                    # What the curves searched (the whole gallery, its unpaired items in the
                    # old space); absent from a fit stored before it was recorded.
                    "searched",
                )
            },
            "vs_random": compared,
        },
        "transition_expected": fit.transition,
        "calibration": {
            "served": CALIBRATION,
            "maps": {name: None if m is None else m.positives for name, m in fit.relevance.items()},
        },
    }
