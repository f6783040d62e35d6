"""The Celery app (``celery -A worker.celery_app worker``), configured by
``app.upgrades.broker``; its one task is ``worker.tasks``."""

from __future__ import annotations

from app.upgrades.broker import RUN_UPGRADE, make_celery

__all__ = ["RUN_UPGRADE", "app", "make_celery"]

app = make_celery()
