"""HTTP for trained models."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.core.arrays import check_batch_size
from app.core.deps import SessionDep, StateDep, TenantDep
from app.core.schemas import LimitQuery, PageTokenQuery
from app.core.tenancy import tenant_page
from app.models import service
from app.models.models import TrainedModel
from app.models.schemas import EmbedRequest, EmbedResponse, ModelList, ModelOut

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


@router.post("/{model_id}/embed", response_model=EmbedResponse)
def embed(
    model_id: str, body: EmbedRequest, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> dict:
    """Embed backbone features: points in the model's frame and their uncertainty."""
    row = service.get_model(session, tenant_id, model_id)
    check_batch_size(len(body.features), "features", state.settings.max_vectors_per_request)
    points, modality = service.embed_features(
        state.models, state.settings, row, body.features, body.modality
    )
    return {
        "modality": modality,
        "embeddings": points.tolist(),
        "uncertainty": service.point_uncertainty(points, row.curv).tolist(),
    }
