"""Datasets: paired feature rows per modality, upserted all or nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from app.core.arrays import as_matrix, check_batch_size, check_count, check_ids, check_labels
from app.core.db import new_id
from app.core.errors import FieldError, conflict, invalid, invalid_fields
from app.core.settings import Settings
from app.core.tenancy import check_name_free, check_tenant_limit, get_owned
from app.datasets.models import Dataset, DatasetItem
from app.datasets.schemas import DatasetCreate
from app.galleries.models import Gallery
from app.galleries.service import IN_CHUNK, get_gallery
from app.jobs.models import QUEUED, RUNNING, UpgradeJob
from app.vectors.storage import storage_for


def get_dataset(session: Session, tenant_id: str, dataset_id: str) -> Dataset:
    return get_owned(session, Dataset, tenant_id, dataset_id, "dataset")


def lock_dataset(session: Session, dataset_id: str) -> Dataset:
    """The dataset row, locked for this transaction and re-read (not the identity map's copy)."""
    return session.scalar(
        select(Dataset)
        .where(Dataset.id == dataset_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )


def gallery_ids_present(session: Session, gallery_id: str, ids: Sequence[str]) -> set[str]:
    """Which of ``ids`` the gallery holds."""
    gallery = session.get(Gallery, gallery_id)
    if gallery is None:
        return set()
    return set(storage_for(session, gallery).lookup(session, gallery, sorted(set(ids))))


def refuse_while_paired(session: Session, gallery: Gallery) -> None:
    """409 while datasets pair their items with ``gallery`` (before deleting it)."""
    datasets = list(session.scalars(select(Dataset.id).where(Dataset.gallery_id == gallery.id)))
    if datasets:
        raise conflict(f"datasets {datasets} pair their items with this gallery; delete them first")


def query_counts(dataset: Dataset) -> dict[str, int]:
    return {
        "count": dataset.query_count,
        "with_old_vectors": dataset.queries_with_old_vectors,
        "with_relevance": dataset.queries_with_relevance,
    }


def create_dataset(
    session: Session, settings: Settings, tenant_id: str, request: DatasetCreate
) -> Dataset:
    check_tenant_limit(
        session,
        Dataset,
        tenant_id,
        settings.max_datasets_per_tenant,
        "datasets",
        "max_datasets_per_tenant",
    )
    check_name_free(session, Dataset, tenant_id, request.name)
    if request.gallery_id is not None:
        get_gallery(session, tenant_id, request.gallery_id)
    dataset = Dataset(
        id=new_id("ds"),
        tenant_id=tenant_id,
        name=request.name,
        gallery_id=request.gallery_id,
        modalities=list(request.modalities),
        dims={},
    )
    session.add(dataset)
    return dataset


def dataset_out(dataset: Dataset) -> dict[str, Any]:
    return {
        "id": dataset.id,
        "name": dataset.name,
        "gallery_id": dataset.gallery_id,
        "modalities": dataset.modalities,
        "dims": dataset.dims,
        "count": dataset.count,
        "queries": query_counts(dataset),
        "created_at": dataset.created_at,
    }


def delete_dataset(session: Session, dataset: Dataset) -> None:
    """The dataset with its items and queries (the database cascades); finished upgrades keep
    their reports and models, with ``dataset_id`` null."""
    dataset = lock_dataset(session, dataset.id)
    active = list(
        session.scalars(
            select(UpgradeJob.id).where(
                UpgradeJob.dataset_id == dataset.id, UpgradeJob.status.in_((QUEUED, RUNNING))
            )
        )
    )
    if active:
        raise conflict(f"upgrades {active} train on this dataset; cancel them first")
    session.delete(dataset)
    session.commit()


def _matrices(
    dataset: Dataset, features: Any, modalities: dict[str, Any] | None
) -> dict[str, tuple[str, Any]]:
    """modality → (field name, rows), checking that exactly the dataset's modalities are given."""
    if (features is None) == (modalities is None):
        raise invalid("features", "give either features or modalities (one per modality)")
    if features is not None:
        if len(dataset.modalities) != 1:
            raise invalid(
                "modalities", f"this dataset has modalities {dataset.modalities}: give each"
            )
        return {dataset.modalities[0]: ("features", features)}
    unknown = sorted(set(modalities) - set(dataset.modalities))
    missing = sorted(set(dataset.modalities) - set(modalities))
    errors = [FieldError(f"modalities.{m}", "not a modality of this dataset") for m in unknown]
    errors += [FieldError(f"modalities.{m}", "required (rows are paired)") for m in missing]
    if errors:
        raise invalid_fields(errors)
    return {m: (f"modalities.{m}", rows) for m, rows in modalities.items()}


def _check_in_gallery(session: Session, gallery_id: str, ids: list[str]) -> None:
    found = gallery_ids_present(session, gallery_id, ids)
    missing = [n for n, i in enumerate(ids) if i not in found]
    if missing:
        raise invalid_fields(
            [FieldError(f"ids[{n}]", f"not in gallery {gallery_id}") for n in missing[:20]]
        )


def upsert_items(
    session: Session,
    settings: Settings,
    dataset: Dataset,
    ids: Sequence[Any],
    features: Any,
    modalities: dict[str, Any] | None,
    labels: Sequence[Any] | None,
) -> tuple[int, int]:
    check_batch_size(len(ids), "ids", settings.max_vectors_per_request)
    ids = check_ids(ids, "ids", max_length=settings.max_id_length)
    check_labels(labels, len(ids))
    validated: dict[str, np.ndarray] = {}
    for modality, (field, rows) in _matrices(dataset, features, modalities).items():
        check_count(len(rows), field, len(ids))
        dim = dataset.dims.get(modality)
        validated[modality] = as_matrix(rows, field, dim=dim, max_dim=settings.max_dim)
    if dataset.gallery_id is not None:
        _check_in_gallery(session, dataset.gallery_id, ids)
    dataset = lock_dataset(session, dataset.id)
    label_list = list(labels) if labels is not None else [None] * len(ids)
    for modality, matrix in validated.items():
        for start in range(0, len(ids), IN_CHUNK):
            session.execute(
                delete(DatasetItem).where(
                    DatasetItem.dataset_id == dataset.id,
                    DatasetItem.modality == modality,
                    DatasetItem.item_id.in_(ids[start : start + IN_CHUNK]),
                )
            )
        session.execute(
            insert(DatasetItem),
            [
                {
                    "dataset_id": dataset.id,
                    "item_id": item_id,
                    "modality": modality,
                    "features": np.ascontiguousarray(row, dtype="<f4").tobytes(),
                    "label": label,
                }
                for item_id, row, label in zip(ids, matrix, label_list, strict=True)
            ],
        )
    dataset.dims = {**dataset.dims, **{m: int(a.shape[1]) for m, a in validated.items()}}
    dataset.count = (
        session.scalar(
            select(func.count()).where(
                DatasetItem.dataset_id == dataset.id, DatasetItem.modality == dataset.modalities[0]
            )
        )
        or 0
    )
    session.commit()
    return len(ids), dataset.count


def load_items(
    session: Session, dataset: Dataset
) -> tuple[list[str], dict[str, np.ndarray], list[str | None]]:
    """Every item with all modalities: (ids, modality → N×D float32, labels), ordered by id."""
    per_modality: dict[str, dict[str, tuple[bytes, str | None]]] = {}
    rows = session.execute(
        select(DatasetItem.modality, DatasetItem.item_id, DatasetItem.features, DatasetItem.label)
        .where(DatasetItem.dataset_id == dataset.id)
        .execution_options(yield_per=5000)
    )
    for modality, item_id, blob, label in rows:
        per_modality.setdefault(modality, {})[item_id] = (blob, label)
    if not per_modality:
        return [], {}, []
    common = set.intersection(*(set(v) for v in per_modality.values()))
    ids = sorted(common)
    first = per_modality[dataset.modalities[0]]
    arrays = {
        m: np.frombuffer(b"".join(items[i][0] for i in ids), dtype="<f4").reshape(
            len(ids), int(dataset.dims[m])
        )
        for m, items in per_modality.items()
    }
    return ids, arrays, [first[i][1] for i in ids]
