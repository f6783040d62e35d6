"""Thin Celery tasks: a message means "a slot may have work"; the executor picks the job."""

from __future__ import annotations

import logging
from functools import lru_cache

import app.db_models
import app.migration.reembed_job
from app.core.db import Database
from app.core.settings import get_settings
from app.upgrades.executor import Claim, run_next, worker_name
from worker.celery_app import RUN_UPGRADE, app

log = logging.getLogger(__name__)


@lru_cache
def worker_db() -> Database:
    """One engine per worker process, built on first use (after the prefork fork)."""
    return Database(get_settings())


@app.task(bind=True, name=RUN_UPGRADE, max_retries=None)
def run_upgrade(self, job_id: str | None = None) -> str:
    """Run the fairest job a claim can start (``run_next``), which need not be ``job_id``: the
    order messages arrive in is the order tenants sent them, and one tenant's burst would run
    before everyone else's jobs. ``job_id`` None: a message sent by a worker that finished."""
    settings = get_settings()
    outcome = run_next(worker_db(), settings, worker=worker_name("celery"), hint=job_id)
    if outcome is Claim.CLAIMED:
        # This slot is free again. A job that was passed over (its tenant at its running cap,
        # or another tenant's turn) may have no message left: send one so that the next fair
        # job starts now, not when the sweeper finds it queued.
        try:
            self.app.send_task(RUN_UPGRADE, args=[None], queue=settings.celery_queue)
        except Exception as exc:
            log.warning("could not send the next-job message (%s); the sweeper will", exc)
    elif outcome is Claim.BUSY:
        # Another worker holds the job — or held it and just died. Look again once its
        # heartbeat would have gone stale; the executor then takes the job over or leaves it.
        raise self.retry(countdown=settings.job_stale_after_s + settings.job_heartbeat_s)
    return outcome.value
