"""Backbone upgrades against an external gallery: assemble the paired data from the database,
train, and report the trained model beside the Procrustes adapter fitted on the same split."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.datasets.models import Dataset, DatasetItem
from app.datasets.service import load_items
from app.galleries.models import Gallery, GalleryVector
from app.galleries.service import lift_of
from app.ml.training import TrainingHooks
from app.ml.upgrade import BACKBONE_METHODS, UpgradeData, run_backbone_upgrade
from app.upgrades.trained import TrainedOutput

METHODS: tuple[str, ...] = tuple(BACKBONE_METHODS)
BASELINE = "procrustes"
MIN_ITEMS = 10


def check_params(method: str, params: dict[str, Any]) -> None:
    """Parameters are the trainer's to judge; here only their JSON shape (a mapping)."""
    if not isinstance(params, dict):
        raise TypeError("params must be an object")


def count_paired(session: Session, dataset: Dataset, gallery: Gallery) -> int:
    return (
        session.scalar(
            select(func.count())
            .select_from(DatasetItem)
            .join(
                GalleryVector,
                (GalleryVector.item_id == DatasetItem.item_id)
                & (GalleryVector.gallery_id == gallery.id),
            )
            .where(DatasetItem.dataset_id == dataset.id)
        )
        or 0
    )


def label_codes(labels: list[str | None]) -> np.ndarray | None:
    """String labels → int64 codes (sorted names); None unless every item has a label."""
    if not labels or any(label is None for label in labels):
        return None
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index[label] for label in labels], dtype=np.int64)


def load_inputs(session: Session, dataset: Dataset, gallery: Gallery) -> tuple[UpgradeData, int]:
    """Dataset rows paired with the gallery's stored old vectors by item id. Labels: the
    dataset's when every item has one, else the gallery's when every item has one, else none."""
    ids, arrays, item_labels = load_items(session, dataset)
    stored: dict[str, tuple[bytes, str | None]] = {}
    for start in range(0, len(ids), 500):
        rows = session.execute(
            select(GalleryVector.item_id, GalleryVector.vector, GalleryVector.label).where(
                GalleryVector.gallery_id == gallery.id,
                GalleryVector.item_id.in_(ids[start : start + 500]),
            )
        )
        stored.update((item_id, (vector, label)) for item_id, vector, label in rows)
    keep = [n for n, item_id in enumerate(ids) if item_id in stored]
    if len(keep) < MIN_ITEMS:
        raise ValueError(f"only {len(keep)} dataset items still have gallery vectors")
    paired_ids = [ids[n] for n in keep]
    features = arrays[dataset.modalities[0]][keep]
    old = np.frombuffer(b"".join(stored[i][0] for i in paired_ids), dtype="<f4").reshape(
        len(paired_ids), gallery.dim
    )
    labels = label_codes([item_labels[n] for n in keep])
    if labels is None:
        labels = label_codes([stored[i][1] for i in paired_ids])
    data = UpgradeData(new_features=np.array(features), old_vectors=np.array(old), labels=labels)
    return data, len(paired_ids)


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
    lift = lift_of(gallery)
    outcome = run_backbone_upgrade(
        method, data, lift, params=params, seed=seed, eval_fraction=eval_fraction, hooks=hooks
    )
    report: dict[str, Any] = {"method": method, "items": len(data.new_features), **outcome.report}
    if method != BASELINE and "procrustes" not in outcome.report:
        hooks.check()
        baseline = run_backbone_upgrade(
            BASELINE, data, lift, seed=seed, eval_fraction=eval_fraction
        )
        report["procrustes"] = baseline.report
    return TrainedOutput(
        model=outcome.model,
        report=report,
        params=outcome.params,
        kind="backbone",
        space={
            "space_model_name": gallery.model_name,
            "space_dim": gallery.dim,
            "lift": lift.to_dict(),
            "trained_on_gallery_id": gallery.id,
        },
    )
