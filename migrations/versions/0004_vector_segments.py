"""vector segments: galleries say where their vectors live and hold the segment manifest

New galleries keep their vectors in append-only segment files under the data dir
(``app.vectors.faiss.segments``); the gallery row holds the manifest (segment names, committed byte
lengths and record counts, next internal id, version). Existing galleries are marked ``sql`` and
keep reading and writing their ``gallery_vectors`` rows: moving them would mean writing files from
inside a migration, which a database rollback cannot undo, so no data moves here.

Re-embedded features pointed at ``gallery_vectors.id`` with a foreign key; internal ids of
segment galleries are per gallery and live in no table, so the key goes (deleting an item now
deletes its re-embedded features explicitly) and uniqueness becomes per (gallery, model, item).

Downgrading refuses while a gallery keeps vectors in segments (their vectors would be lost).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("galleries") as batch:
        batch.add_column(
            sa.Column("vector_storage", sa.String(length=16), server_default="sql", nullable=False)
        )
        batch.add_column(sa.Column("vector_manifest", sa.JSON(), nullable=True))
    with op.batch_alter_table("gallery_reembedded") as batch:
        batch.drop_constraint(
            op.f("fk_gallery_reembedded_vector_id_gallery_vectors"), type_="foreignkey"
        )
        batch.drop_constraint(op.f("uq_gallery_reembedded_model_id_vector_id"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_gallery_reembedded_gallery_id_model_id_vector_id"),
            ["gallery_id", "model_id", "vector_id"],
        )


def downgrade() -> None:
    segmented = op.get_bind().scalar(
        sa.text("SELECT count(*) FROM galleries WHERE vector_storage != 'sql'")
    )
    if segmented:
        raise RuntimeError(
            f"{segmented} galleries keep their vectors in segment files or in Milvus, not in SQL "
            "rows; export and delete them before downgrading below 0004"
        )
    with op.batch_alter_table("gallery_reembedded") as batch:
        batch.drop_constraint(
            op.f("uq_gallery_reembedded_gallery_id_model_id_vector_id"), type_="unique"
        )
        batch.create_unique_constraint(
            op.f("uq_gallery_reembedded_model_id_vector_id"), ["model_id", "vector_id"]
        )
        batch.create_foreign_key(
            op.f("fk_gallery_reembedded_vector_id_gallery_vectors"),
            "gallery_vectors",
            ["vector_id"],
            ["id"],
            ondelete="CASCADE",
        )
    with op.batch_alter_table("galleries") as batch:
        batch.drop_column("vector_manifest")
        batch.drop_column("vector_storage")
