"""Backbone upgrades against an external gallery: check the request, assemble the paired data
(and the dataset's query log) from the database, train, and report the trained model beside the
Procrustes adapter fitted on the same split."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import FieldError, invalid_fields
from app.datasets.models import Dataset, DatasetItem
from app.datasets.queries import load_queries
from app.datasets.service import load_items
from app.galleries.models import Gallery
from app.ml.methods.training import TrainingHooks
from app.ml.upgrade.data import MAX_DISTRACTORS
from app.ml.upgrade.run import (
    BACKBONE_METHODS,
    QueryLog,
    UpgradeData,
    check_backbone_request,
    run_backbone_upgrade,
)
from app.upgrades.trained import TrainedOutput
from app.vectors.engine import SEARCHED_IN_ENGINE
from app.vectors.points import lift_of
from app.vectors.storage import storage_for

METHODS: tuple[str, ...] = tuple(BACKBONE_METHODS)
# The job's objective travels in its params (beside the trainer's knobs, shown by GET
# /v1/upgrades/{id}); it is taken out again before the knobs reach the trainer.
OBJECTIVE_PARAM = "objective"
# Likewise the request's old_model_available, stored only when false.
OLD_MODEL_PARAM = "old_model_available"
# The seed of the distractor sample of a gallery with more than ``MAX_DISTRACTORS`` unpaired
# items: fixed, so the upgrade and the backfill fit that re-reads its inputs see one sample.
DISTRACTOR_SEED = 44
# Rows asked for by one fetch when the distractors are read by id: bounds one request to an engine
# (a Milvus ``in`` filter, a pgvector ``ANY`` array, a Qdrant retrieve) and one answer's memory.
FETCH_BATCH = 4096
QUERY_SUMMARY = (
    "queries",
    "queries_with_old_vectors",
    "queries_with_relevance",
    "queries_relevant_dropped",
)


def _paired_labels(
    session: Session, dataset: Dataset, gallery: Gallery
) -> list[tuple[str | None, str | None]]:
    """(dataset label, gallery label) of every dataset item the gallery holds."""
    items = dict(
        session.execute(
            select(DatasetItem.item_id, DatasetItem.label).where(
                DatasetItem.dataset_id == dataset.id
            )
        ).all()
    )
    found = storage_for(session, gallery).lookup(session, gallery, sorted(items))
    return [(items[item_id], label) for item_id, (_, label) in found.items()]


def check_request(
    session: Session,
    method: str,
    params: dict[str, Any],
    dataset: Dataset,
    gallery: Gallery,
    *,
    seed: int,
    eval_fraction: float,
    objective: str | None,
) -> None:
    """What the trainer would refuse, refused before a job exists (422 naming the field)."""
    pairs = _paired_labels(session, dataset, gallery)
    paired = len(pairs)
    unlabelled_items = any(item is None for item, _ in pairs)
    unlabelled_vectors = any(vector is None for _, vector in pairs)
    labelled = not (unlabelled_items and unlabelled_vectors)
    problems = check_backbone_request(
        method,
        params,
        paired,
        eval_fraction,
        seed,
        labelled,
        objective=objective,
        n_queries=dataset.query_count,
        queries_with_relevance=dataset.queries_with_relevance,
    )
    if "dataset_id" in problems:
        problems["dataset_id"] = (
            f"{paired} dataset items have vectors in gallery {gallery.id}: {problems['dataset_id']}"
        )
    if "needs labels" in problems.get("method", ""):
        problems["method"] += " (on the dataset or the gallery)"
    if problems:
        raise invalid_fields([FieldError(f, reason) for f, reason in problems.items()])


def label_codes(labels: list[str | None]) -> np.ndarray | None:
    """String labels → int64 codes (sorted names); None unless every item has a label."""
    if not labels or any(label is None for label in labels):
        return None
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index[label] for label in labels], dtype=np.int64)


def _query_log(
    session: Session, dataset: Dataset, paired_ids: list[str]
) -> tuple[QueryLog | None, dict[str, int]]:
    """The dataset's queries with relevant ids mapped to rows of the paired data; relevant ids
    whose items are not paired (no dataset features) are dropped and counted."""
    logged = load_queries(session, dataset)
    if logged is None:
        return None, dict.fromkeys(QUERY_SUMMARY, 0)
    row_of = {item_id: n for n, item_id in enumerate(paired_ids)}
    relevant = [[row_of[i] for i in items if i in row_of] for items in logged.relevant_ids]
    given = sum(len(items) for items in logged.relevant_ids)
    kept = sum(len(rows) for rows in relevant)
    summary = {
        "queries": len(logged.ids),
        "queries_with_old_vectors": 0 if logged.old_vectors is None else len(logged.ids),
        "queries_with_relevance": sum(1 for rows in relevant if rows),
        "queries_relevant_dropped": given - kept,
    }
    has_relevance = summary["queries_with_relevance"] > 0
    if logged.old_vectors is None and not has_relevance:
        # Nothing left to learn from: every relevant item lacks dataset features.
        return None, summary
    log = QueryLog(
        features=logged.features,
        old_vectors=logged.old_vectors,
        relevant=[np.array(rows, dtype=np.int64) for rows in relevant] if has_relevance else None,
    )
    return log, summary


def _unpaired_vectors(
    session: Session, gallery: Gallery, paired: np.ndarray
) -> tuple[np.ndarray, int]:
    """(old vectors of the gallery's items the dataset does not pair, how many there are),
    ascending internal id: all of them up to ``MAX_DISTRACTORS``, a seeded sample beyond.
    Skipped when the dataset pairs every item. Read by one scan of the gallery (its batches
    bound the memory), or by id (``_read_by_id``) where a scan would ship many more vectors
    than are wanted across the network."""
    storage = storage_for(session, gallery)
    stored = storage.all_ids(session, gallery)
    others = np.setdiff1d(stored, paired)
    total = int(others.size)
    if total == 0:
        return np.zeros((0, gallery.dim), dtype=np.float32), 0
    if total > MAX_DISTRACTORS:
        rng = np.random.default_rng(DISTRACTOR_SEED)
        others = np.sort(rng.choice(others, MAX_DISTRACTORS, replace=False))
    if _read_by_id(gallery, others.size, stored.size):
        return _vectors_by_id(session, gallery, others), total
    parts = [
        batch.vectors[keep]
        for batch in storage.scan(session, gallery)
        if (keep := np.isin(batch.ids, others)).any()
    ]
    return np.concatenate(parts).astype(np.float32, copy=False), total


def _read_by_id(gallery: Gallery, wanted: int, stored: int) -> bool:
    """Whether ``wanted`` of the ``stored`` vectors are fetched by id rather than scanned: where
    the engine is across the network (Milvus, an attached collection or table) and a scan would
    read more than twice the rows wanted. A scan of an attached million-row collection for a
    sample of a tenth of it shipped every vector (issue 46); FAISS galleries are scanned from
    local files, and near-whole reads are cheaper as one scan than as many lookups."""
    return gallery.vector_storage in SEARCHED_IN_ENGINE and 2 * wanted < stored


def _vectors_by_id(session: Session, gallery: Gallery, ids: np.ndarray) -> np.ndarray:
    """The stored vectors of internal ``ids`` (ascending), fetched by item id in batches of
    ``FETCH_BATCH``, ascending internal id; an id gone since it was listed is left out, as a
    scan leaves it out."""
    storage = storage_for(session, gallery)
    parts = [np.zeros((0, gallery.dim), dtype=np.float32)]
    for start in range(0, ids.size, FETCH_BATCH):
        chunk = ids[start : start + FETCH_BATCH].tolist()
        named = storage.names(session, gallery, chunk)
        fetched = storage.fetch(session, gallery, [named[i][0] for i in chunk if i in named])
        order = np.argsort(fetched.ids, kind="stable")
        parts.append(np.asarray(fetched.vectors, dtype=np.float32)[order])
    return np.concatenate(parts)


def load_inputs(
    session: Session, dataset: Dataset, gallery: Gallery
) -> tuple[UpgradeData, dict[str, int]]:
    """Dataset rows paired with the gallery's stored old vectors by item id, the dataset's
    query log, and the old vectors of the gallery's other items (``UpgradeData.distractors``:
    the held-out figures search the whole gallery, as its users do). Labels: the dataset's when
    every item has one, else the gallery's when every item has one, else none. Also returns
    what was loaded, for the report (``paired_items``, ``queries``,
    ``queries_with_old_vectors``, ``queries_with_relevance``, ``queries_relevant_dropped``)."""
    ids, arrays, item_labels = load_items(session, dataset)
    stored = storage_for(session, gallery).fetch(session, gallery, ids)
    row_of = {item_id: n for n, item_id in enumerate(ids)}
    keep = [row_of[item_id] for item_id in stored.item_ids]
    paired_ids = stored.item_ids
    features = arrays[dataset.modalities[0]][keep]
    old = stored.vectors
    labels = label_codes([item_labels[n] for n in keep])
    if labels is None:
        labels = label_codes(stored.labels)
    queries, summary = _query_log(session, dataset, paired_ids)
    distractors, unpaired = _unpaired_vectors(session, gallery, stored.ids)
    data = UpgradeData(
        new_features=np.array(features),
        old_vectors=np.array(old),
        labels=labels,
        queries=queries,
        distractors=distractors,
        unpaired_total=unpaired if unpaired > len(distractors) else None,
    )
    return data, {"paired_items": len(paired_ids), **summary}


def train(
    method: str,
    data: UpgradeData,
    gallery: Gallery,
    *,
    params: dict[str, Any],
    seed: int,
    eval_fraction: float,
    hooks: TrainingHooks,
) -> TrainedOutput:
    """The trainer's report already sets the ``procrustes`` adapter, fitted on the same split,
    beside the trained model (``report["metrics"]``). ``params`` may hold the job's objective."""
    knobs = {k: v for k, v in params.items() if k not in (OBJECTIVE_PARAM, OLD_MODEL_PARAM)}
    lift = lift_of(gallery)
    outcome = run_backbone_upgrade(
        method,
        data,
        lift,
        params=knobs,
        seed=seed,
        eval_fraction=eval_fraction,
        hooks=hooks,
        objective=params.get(OBJECTIVE_PARAM),
        old_model_available=bool(params.get(OLD_MODEL_PARAM, True)),
    )
    return TrainedOutput(
        model=outcome.model,
        report={"paired_items": len(data), **outcome.report},
        params=outcome.params,
        kind="backbone",
        method=outcome.method,
        space={
            "space_model_name": gallery.model_name,
            "space_dim": gallery.dim,
            "lift": lift.to_dict(),
            "trained_on_gallery_id": gallery.id,
        },
    )
