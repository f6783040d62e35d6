"""embedders and texts: two-stage search's new backbone endpoint and the items' document texts

``embedders`` holds each tenant's registered embedding endpoints; ``models.embedder_id`` names
the one a model's two-stage searches use (NULL for every existing model: nothing changes for
them); ``gallery_texts`` holds an item's document text, keyed like its vector and deleted with
its gallery. Downgrading drops all three and nothing else (texts were never readable below 0011).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "embedders",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("dimension", sa.Integer(), nullable=False),
        sa.Column("api_key_env", sa.String(length=128), nullable=True),
        sa.Column("query_prefix", sa.String(length=256), nullable=False),
        sa.Column("document_prefix", sa.String(length=256), nullable=False),
        sa.Column("max_batch", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_embedders_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_embedders")),
        sa.UniqueConstraint("tenant_id", "name", name=op.f("uq_embedders_tenant_id_name")),
    )
    with op.batch_alter_table("embedders", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_embedders_tenant_id"), ["tenant_id"])
    op.create_table(
        "gallery_texts",
        sa.Column("gallery_id", sa.String(length=40), nullable=False),
        sa.Column("vector_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["gallery_id"],
            ["galleries.id"],
            name=op.f("fk_gallery_texts_gallery_id_galleries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("gallery_id", "vector_id", name=op.f("pk_gallery_texts")),
    )
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("embedder_id", sa.String(length=40), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_models_embedder_id_embedders"), "embedders", ["embedder_id"], ["id"]
        )


def downgrade() -> None:
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_models_embedder_id_embedders"), type_="foreignkey")
        batch_op.drop_column("embedder_id")
    op.drop_table("gallery_texts")
    with op.batch_alter_table("embedders", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_embedders_tenant_id"))
    op.drop_table("embedders")
