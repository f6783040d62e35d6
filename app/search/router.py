"""HTTP for gallery search."""

from __future__ import annotations

from fastapi import APIRouter

from app.core.deps import SessionDep, StateDep, TenantDep
from app.galleries.service import get_gallery
from app.search import service
from app.search.schemas import SearchRequest, SearchResponse

router = APIRouter(prefix="/v1/galleries", tags=["search"])


@router.post(
    "/{gallery_id}/search", response_model=SearchResponse, response_model_exclude_none=True
)
def search(
    gallery_id: str, body: SearchRequest, state: StateDep, session: SessionDep, tenant_id: TenantDep
) -> dict:
    """k nearest gallery items per query, by exact Lorentz distance. With `model_id` the vectors
    are that model's input features; an incompatible model answers 409."""
    gallery = get_gallery(session, tenant_id, gallery_id)
    results = service.search_gallery(
        session, state.settings, state.indexes, state.models, tenant_id, gallery, body
    )
    return {"results": results}
