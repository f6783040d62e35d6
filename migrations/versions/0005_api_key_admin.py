"""api key admin: a flag on every key; admin keys manage their tenant's keys (/v1/keys)

Every key that exists was made by ``nobackfill create-key`` or is the local or bootstrap key:
each could already do anything its tenant can, so each becomes an admin key. Keys created later
through ``POST /v1/keys`` are admin keys only when asked for. The server default is false, so a
row written without the flag (an older process during a rolling upgrade) grants nothing more.

Downgrading drops the flag and keeps every key (below 0005 no key manages keys).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(
            sa.Column("admin", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
    # A bound value, not a literal: SQLite and PostgreSQL spell a true boolean differently.
    api_keys = sa.table("api_keys", sa.column("admin", sa.Boolean()))
    op.execute(api_keys.update().values(admin=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("admin")
