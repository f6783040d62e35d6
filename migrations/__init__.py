"""Alembic migration scripts (shipped inside the package so an installed copy can migrate)."""
