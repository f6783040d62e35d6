"""The Celery app's configuration, shared by the sender (``app.upgrades.runner``'s Celery runner,
in the API process) and the receiver (``worker.celery_app``). Redis is transport, the job row in
the database is the truth. Late acks + prefetch 1: a message is acknowledged only once its job
ran, and a killed worker's job is delivered again (the executor retries or fails it)."""

from __future__ import annotations

from celery import Celery

from app.core.settings import Settings, get_settings

RUN_UPGRADE = "nobackfill.run_upgrade"


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    celery = Celery("nobackfill", broker=settings.redis_url, include=["worker.tasks"])
    celery.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": settings.job_visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        task_default_queue=settings.celery_queue,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
    )
    return celery
