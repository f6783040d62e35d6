"""Thin Celery tasks: load the job by id and hand it to the executor."""

from __future__ import annotations

from functools import lru_cache

import app.db_models
import app.migration.reembed_job
from app.core.db import Database
from app.core.settings import get_settings
from app.upgrades.executor import Claim, execute, worker_name
from worker.celery_app import RUN_UPGRADE, app


@lru_cache
def worker_db() -> Database:
    """One engine per worker process, built on first use (after the prefork fork)."""
    return Database(get_settings())


@app.task(bind=True, name=RUN_UPGRADE, max_retries=None)
def run_upgrade(self, job_id: str) -> str:
    settings = get_settings()
    outcome = execute(worker_db(), settings, job_id, worker=worker_name("celery"))
    if outcome is Claim.BUSY:
        # Another worker holds the job — or held it and just died. Look again once its
        # heartbeat would have gone stale; the executor then takes the job over or leaves it.
        raise self.retry(countdown=settings.job_stale_after_s + settings.job_heartbeat_s)
    return outcome.value
