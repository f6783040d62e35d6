"""Embedders: register, read, list, delete (a tenant's own only), and the spec a call uses."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.db import new_id
from app.core.errors import conflict, invalid
from app.core.settings import Settings
from app.core.tenancy import check_name_free, check_tenant_limit, get_owned
from app.embedders.client import EmbedderSpec
from app.embedders.models import Embedder
from app.embedders.schemas import EmbedderCreate
from app.vectors.source_rules import env_secret, normalized_url, url_allowed


def get_embedder(session: Session, tenant_id: str, embedder_id: str) -> Embedder:
    return get_owned(session, Embedder, tenant_id, embedder_id, "embedder")


def create_embedder(
    session: Session, settings: Settings, tenant_id: str, body: EmbedderCreate
) -> Embedder:
    """The row of a new embedder (staged; the caller commits). No call is made to it here: an
    embedder that is down when registered is still a valid registration, and searches degrade
    while it stays down."""
    check_tenant_limit(
        session,
        Embedder,
        tenant_id,
        settings.max_embedders_per_tenant,
        "embedders",
        "max_embedders_per_tenant",
    )
    check_name_free(session, Embedder, tenant_id, body.name)
    url = normalized_url(body.url)
    if url is None:
        raise invalid(
            "url",
            "not a plain server URL: no credentials, query, fragment, backslash, whitespace or "
            "doubly encoded path",
        )
    if not url_allowed(settings.embedder_allowed_urls, url):
        raise invalid(
            "url",
            "not an allowed embedder (NOBACKFILL_EMBEDDER_ALLOWED_URLS lists them; "
            f"{len(settings.embedder_allowed_urls)} allowed)",
        )
    env_secret(settings.embedder_api_key_env_prefix, body.api_key_env, "api_key_env")
    if body.max_batch > settings.embedder_max_batch:
        raise invalid("max_batch", f"must be ≤ {settings.embedder_max_batch}")
    if body.dimension > settings.max_dim:
        raise invalid("dimension", f"exceeds the limit of {settings.max_dim}")
    row = Embedder(
        id=new_id("emb"),
        tenant_id=tenant_id,
        name=body.name,
        url=url,
        model=body.model,
        dimension=body.dimension,
        api_key_env=body.api_key_env,
        query_prefix=body.query_prefix,
        document_prefix=body.document_prefix,
        max_batch=body.max_batch,
    )
    session.add(row)
    return row


def delete_embedder(session: Session, row: Embedder) -> None:
    """Delete (committed); 409 while a model names it (clear the models' embedder first)."""
    from app.models.models import TrainedModel

    users = list(session.scalars(select(TrainedModel.id).where(TrainedModel.embedder_id == row.id)))
    if users:
        raise conflict(
            f"models {users} use this embedder; set their embedder_id to null first "
            "(PATCH /v1/models/{id})"
        )
    session.delete(row)
    session.commit()


def spec_of(row: Embedder) -> EmbedderSpec:
    return EmbedderSpec(
        id=row.id,
        url=row.url,
        model=row.model,
        dimension=row.dimension,
        api_key_env=row.api_key_env,
        query_prefix=row.query_prefix,
        document_prefix=row.document_prefix,
        max_batch=row.max_batch,
    )


def embedder_out(row: Embedder) -> dict:
    return {
        "id": row.id,
        "name": row.name,
        "url": row.url,
        "model": row.model,
        "dimension": row.dimension,
        "api_key_env": row.api_key_env,
        "query_prefix": row.query_prefix,
        "document_prefix": row.document_prefix,
        "max_batch": row.max_batch,
        "created_at": row.created_at,
    }


def set_model_embedder(
    session: Session, tenant_id: str, model: Any, embedder_id: str | None
) -> None:
    """Name (or, with None, clear) the model's embedder (committed): the tenant's own, returning
    vectors of the model's input dimension (422 otherwise)."""
    if embedder_id is not None:
        row = get_embedder(session, tenant_id, embedder_id)
        dims = sorted({int(d) for d in (model.input_dims or {}).values()})
        if row.dimension not in dims:
            raise invalid(
                "embedder_id",
                f"embedder {row.id} returns {row.dimension}-dimensional vectors; model "
                f"{model.id} takes {dims}",
            )
    model.embedder_id = embedder_id
    session.commit()
