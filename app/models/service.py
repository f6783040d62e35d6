"""Trained models: artifacts on disk (checksummed), loading, embedding, and which galleries a
model may search (its compatibility is with an old embedding *space*, not one gallery)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.core.arrays import as_matrix
from app.core.errors import Problem, conflict, invalid, not_found
from app.core.files import ChecksumMismatch, read_verified, sha256_hex, write_atomically
from app.core.settings import Settings
from app.core.tenancy import get_owned
from app.ml.geometry.lorentz import uncertainty
from app.ml.hmcl import map_query_to_ancestor
from app.ml.methods.models import EmbeddingModel, model_from_bytes
from app.models.export import EXPORT_FORMATS, ExportTarget, export_onnx
from app.models.models import TrainedModel
from app.vectors.tables import ReembeddedVector

BACKBONE, CONTINUAL = "backbone", "continual"
# Maps embeddings of a model (N×d) into a gallery's frame.


def store_artifact(settings: Settings, name: str, blob: bytes) -> tuple[str, str, int]:
    """Write an artifact atomically; returns (path relative to the artifact dir, sha256, size)."""
    write_atomically(settings.artifact_dir / name, blob)
    return name, sha256_hex(blob), len(blob)


def artifact_file(settings: Settings, relative: str) -> Path:
    return settings.artifact_dir / relative


class ModelCache:
    """Loaded models by id (LRU); every load verifies the artifact's checksum."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._models: OrderedDict[str, EmbeddingModel] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, row: TrainedModel) -> EmbeddingModel:
        with self._lock:
            if row.id in self._models:
                self._models.move_to_end(row.id)
                return self._models[row.id]
        model = model_from_bytes(read_artifact(self.settings, row))
        with self._lock:
            self._models[row.id] = model
            while len(self._models) > self.settings.model_cache_size:
                self._models.popitem(last=False)
        return model

    def forget(self, model_id: str) -> None:
        with self._lock:
            self._models.pop(model_id, None)


def read_artifact(settings: Settings, row: TrainedModel) -> bytes:
    """The artifact's bytes, checksum verified; a missing or altered file is a 500 problem."""
    try:
        return read_verified(artifact_file(settings, row.artifact_path), row.artifact_sha256)
    except (ChecksumMismatch, FileNotFoundError) as exc:
        raise Problem(
            500,
            "Model artifact unusable",
            f"model {row.id}: {exc}; restore the artifact from a backup or retrain",
            slug="artifact-unusable",
        ) from exc


def get_model(session: Session, tenant_id: str, model_id: str) -> TrainedModel:
    return get_owned(session, TrainedModel, tenant_id, model_id, "model")


def resolve_modality(row: TrainedModel, modality: str | None, field: str = "modality") -> str:
    if modality is None:
        if len(row.modalities) != 1:
            raise invalid(field, f"required: this model has modalities {row.modalities}")
        return row.modalities[0]
    if modality not in row.modalities:
        raise invalid(field, f"unknown modality {modality!r}, expected one of {row.modalities}")
    return modality


def embed_features(
    cache: ModelCache,
    settings: Settings,
    row: TrainedModel,
    features: list[list[float]] | np.ndarray,
    modality: str | None,
    field: str = "features",
) -> tuple[np.ndarray, str]:
    """Validated features → the model's points (space components, float32) and the modality."""
    modality = resolve_modality(row, modality)
    matrix = as_matrix(features, field, dim=int(row.input_dims[modality]), max_dim=settings.max_dim)
    model = cache.load(row)
    return model.embed(matrix, modality), modality


def point_uncertainty(points: np.ndarray, curv: float) -> np.ndarray:
    """u(x) = 1 − tanh(√c‖log₀ x‖): near the origin means vague (see app.ml.geometry.lorentz)."""
    return uncertainty(torch.as_tensor(points, dtype=torch.float64), curv).numpy()


def rotation_matrix(row: TrainedModel) -> np.ndarray | None:
    if row.rotation is None:
        return None
    return np.frombuffer(row.rotation, dtype=np.float64).reshape(row.output_dim, row.output_dim)


def lineage(session: Session, row: TrainedModel) -> list[TrainedModel]:
    """``row`` and its ancestors, newest first."""
    chain = [row]
    while chain[-1].parent_id is not None:
        parent = session.get(TrainedModel, chain[-1].parent_id)
        if parent is None:
            break
        chain.append(parent)
    return chain


def query_to_ancestor(chain: list[TrainedModel]):
    """``chain`` = [version j, …, version i] (newest first): queries embedded by j enter i's
    frame through the rotations recorded by versions i+1 … j."""
    rotations = [rotation_matrix(version) for version in reversed(chain[:-1])]

    def to_ancestor(points: np.ndarray) -> np.ndarray:
        return map_query_to_ancestor(points, rotations).astype(np.float32)

    return to_ancestor


def remove_orphan_artifacts(session: Session, settings: Settings, min_age_s: float = 3600) -> None:
    """Artifact files no model row names (a crash between the write and the commit). Young files
    are left alone: another process may be about to commit the row naming them."""
    import logging
    import time

    directory = settings.artifact_dir
    if not directory.exists():
        return
    known = {
        name
        for pair in session.execute(select(TrainedModel.artifact_path, TrainedModel.state_path))
        for name in pair
        if name
    }
    now = time.time()
    for file in directory.iterdir():
        if file.name in known or now - file.stat().st_mtime < min_age_s:
            continue
        file.unlink(missing_ok=True)
        logging.getLogger(__name__).warning("removed orphan artifact %s", file.name)


def lock_model(session: Session, model_id: str, shared: bool = False) -> TrainedModel:
    """Re-read the model's row under a row lock, 404 if it is gone: ``shared`` for a write that
    depends on the model (an upload of items re-embedded for it), exclusive for its delete, so
    the two are ordered. SQLite has no row locks: a no-op UPDATE takes the database's write lock
    (writers in other processes wait here too)."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(TrainedModel)
            .where(TrainedModel.id == model_id)
            .values(method=TrainedModel.method)
            .execution_options(synchronize_session=False)
        )
    locked = session.scalar(
        select(TrainedModel)
        .where(TrainedModel.id == model_id)
        .with_for_update(read=shared)
        .execution_options(populate_existing=True)
    )
    if locked is None:
        raise not_found("model", model_id)
    return locked


def reembedded_by_gallery(session: Session, model_id: str) -> dict[str, int]:
    """Items re-embedded for ``model_id``, per gallery (acknowledged uploads a delete would drop)."""
    rows = session.execute(
        select(ReembeddedVector.gallery_id, func.count())
        .where(ReembeddedVector.model_id == model_id)
        .group_by(ReembeddedVector.gallery_id)
        .order_by(ReembeddedVector.gallery_id)
    )
    return {gallery_id: int(count) for gallery_id, count in rows}


def delete_model(
    session: Session,
    settings: Settings,
    cache: ModelCache,
    row: TrainedModel,
    cascade: bool = False,
) -> dict[str, Any]:
    """Delete a model nothing depends on, then its files (after the commit: a crash in between
    leaves orphan files, which ``remove_orphan_artifacts`` collects, never a row without them).
    The galleries bound to it are checked first by the caller
    (``app.galleries.service.refuse_while_bound``: galleries lie above models).

    Items re-embedded for the model are the user's uploads: 409 naming them unless ``cascade``,
    which deletes them with the model; returns what was cascaded."""
    from app.jobs.models import QUEUED, RUNNING, UpgradeJob

    row = lock_model(session, row.id)
    children = list(
        session.scalars(select(TrainedModel.id).where(TrainedModel.parent_id == row.id))
    )
    if children:
        raise conflict(
            f"model versions {sorted(children)} continue from model {row.id}; delete them first"
        )
    active = list(
        session.scalars(
            select(UpgradeJob.id).where(
                UpgradeJob.base_model_id == row.id, UpgradeJob.status.in_((QUEUED, RUNNING))
            )
        )
    )
    if active:
        raise conflict(f"upgrades {sorted(active)} are training from model {row.id}; cancel them")
    reembedded = reembedded_by_gallery(session, row.id)
    if reembedded and not cascade:
        listed = ", ".join(f"{gallery_id}: {n}" for gallery_id, n in reembedded.items())
        raise conflict(
            f"galleries hold {sum(reembedded.values())} items re-embedded for model {row.id} "
            f"({listed}); deleting the model would delete them: repeat with ?cascade=true to "
            "delete them with it"
        )
    files = [name for name in (row.artifact_path, row.state_path) if name]
    session.delete(row)
    session.commit()
    cache.forget(row.id)
    for name in files:
        artifact_file(settings, name).unlink(missing_ok=True)
    # The rows went with the model (their foreign key cascades).
    return {"reembedded_items": sum(reembedded.values()), "by_gallery": reembedded}


def export_target(row: TrainedModel, modality: str | None) -> ExportTarget:
    """What the exporter needs to know about ``row``; ``modality`` defaults to the first."""
    chosen = row.modalities[0] if modality is None else resolve_modality(row, modality)
    return ExportTarget(
        model_id=row.id,
        kind=row.kind,
        method=row.method,
        modality=chosen,
        input_dim=int(row.input_dims[chosen]),
        output_dim=int(row.output_dim),
        curv=float(row.curv),
        space_model_name=row.space_model_name,
        space_dim=row.space_dim,
        lift=dict(row.lift) if row.lift is not None else None,
    )


def export_model(
    cache: ModelCache, row: TrainedModel, export_format: str, modality: str | None
) -> bytes:
    """The export bundle (a zip) of ``row`` in ``export_format``."""
    if export_format not in EXPORT_FORMATS:
        raise invalid(
            "format", f"unknown format {export_format!r}, expected one of {list(EXPORT_FORMATS)}"
        )
    target = export_target(row, modality)
    return export_onnx(cache.load(row), target)
