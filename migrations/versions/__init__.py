"""Alembic revisions, one file each."""
