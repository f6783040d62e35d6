"""Upgrade jobs: synchronous validation at POST (bad input never becomes a failed job), then a
queued row that a runner executes; cancel through a flag the trainer polls between epochs."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db import new_id, utcnow
from app.core.errors import Problem, conflict, invalid
from app.core.settings import Settings
from app.core.tenancy import get_owned
from app.datasets.models import Dataset
from app.datasets.service import get_dataset
from app.galleries.service import get_gallery
from app.jobs.models import CANCELLED, QUEUED, RUNNING, TERMINAL, UpgradeJob
from app.models.service import get_model
from app.upgrades import backbone, catalogue, continual
from app.upgrades.cost import estimated_steps
from app.upgrades.schemas import UpgradeCreate

DEFAULT_STALE_AFTER_S = Settings.model_fields["job_stale_after_s"].default


def server_caps(settings: Settings) -> dict[str, tuple[str, int]]:
    """Parameters this server caps below what the trainers accept: name → (setting, cap)."""
    return {
        "epochs": ("job_max_epochs", settings.job_max_epochs),
        "hidden_dim": ("job_max_hidden_dim", settings.job_max_hidden_dim),
        "adapter_hidden": ("job_max_hidden_dim", settings.job_max_hidden_dim),
        "min_batches_per_epoch": ("job_max_batches_per_epoch", settings.job_max_batches_per_epoch),
    }


def all_methods(settings: Settings) -> dict[str, Any]:
    """The method catalogue: names, descriptions and each parameter's type, default and range,
    derived from the trainers (``app.upgrades.catalogue``), with the maxima this server's caps
    set (``server_caps``): exactly the ranges a request is accepted in."""
    out = catalogue.catalogue()
    caps = server_caps(settings)
    for entry in out["methods"]:
        for spec in entry["params"]:
            if spec["name"] not in caps:
                continue
            cap = caps[spec["name"]][1]
            current = spec.get("maximum")
            if "exclusive_maximum" in spec:
                current = min(current or math.inf, spec["exclusive_maximum"] - 1)
                del spec["exclusive_maximum"]
            spec["maximum"] = cap if current is None else min(current, cap)
    return out


def get_upgrade(session: Session, tenant_id: str, upgrade_id: str) -> UpgradeJob:
    return get_owned(session, UpgradeJob, tenant_id, upgrade_id, "upgrade")


def _validate_backbone(session: Session, tenant_id: str, request: UpgradeCreate, dataset) -> str:
    if request.base_model_id is not None:
        raise invalid("base_model_id", "backbone upgrades start from the gallery, not a model")
    gallery_id = request.gallery_id or dataset.gallery_id
    if gallery_id is None:
        raise invalid("gallery_id", "required: the gallery whose old vectors the model must reach")
    if dataset.gallery_id != gallery_id:
        raise invalid(
            "dataset_id",
            f"dataset {dataset.id} pairs its items with "
            + (f"gallery {dataset.gallery_id}" if dataset.gallery_id else "no gallery")
            + f", not {gallery_id}",
        )
    gallery = get_gallery(session, tenant_id, gallery_id)
    if gallery.bound_model_id is not None:
        raise invalid("gallery_id", "backbone upgrades need an external gallery (old vectors)")
    if len(dataset.modalities) != 1:
        raise invalid("dataset_id", "backbone upgrades take a one-modality dataset")
    for name in (backbone.OBJECTIVE_PARAM, backbone.OLD_MODEL_PARAM):
        if name in (request.params or {}):
            raise invalid("params", f"{name} is a field of the request, not a parameter")
    _check_structure(request.params or {}, dataset, gallery)
    backbone.check_request(
        session,
        request.method,
        request.params or {},
        dataset,
        gallery,
        seed=request.seed,
        eval_fraction=request.eval_fraction,
        objective=request.objective,
    )
    return gallery.id


def _check_structure(params: dict[str, Any], dataset: Any, gallery: Any) -> None:
    """422 for a structure setting wider than the data (``structure_ceiling``: a rank above
    min(new, old) dimensions, a hidden layer above 4 × the wider side): no richer map, only a
    slower one."""
    from app.ml.auto.candidates import structure_ceiling

    new_dim = int(next(iter((dataset.dims or {}).values()), 0) or 0)
    if not new_dim or not gallery.dim:
        return
    for name in ("adapter_rank", "adapter_hidden", "map_hidden"):
        value = params.get(name)
        ceiling = structure_ceiling(name, new_dim, int(gallery.dim))
        if (
            ceiling is not None
            and isinstance(value, int)
            and not isinstance(value, bool)
            and value > ceiling
        ):
            raise invalid(
                f"params.{name}",
                f"must be ≤ {ceiling} for {new_dim}-dimensional features and a "
                f"{gallery.dim}-dimensional gallery (wider is no richer map, only slower)",
            )


def _check_quotas(
    session: Session, settings: Settings, tenant_id: str, params: dict[str, Any]
) -> None:
    """What one tenant may ask of the shared workers: parameter ranges (422 naming the
    parameter and its setting) and queued plus running jobs (429 naming the limit)."""
    for name, (setting, cap) in server_caps(settings).items():
        value = params.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
            raise invalid(
                f"params.{name}",
                f"must be ≤ {cap} on this server (NOBACKFILL_{setting.upper()})",
            )
    check_job_quota(session, settings, tenant_id)


def check_job_quota(session: Session, settings: Settings, tenant_id: str) -> None:
    """429 when the tenant already has its most jobs queued or running (jobs of every kind:
    upgrades and re-embed jobs share the workers)."""
    active = session.scalar(
        select(func.count())
        .select_from(UpgradeJob)
        .where(UpgradeJob.tenant_id == tenant_id, UpgradeJob.status.in_((QUEUED, RUNNING)))
    )
    if active >= settings.max_active_jobs_per_tenant:
        raise Problem(
            429,
            "Too many requests",
            f"this tenant has {active} jobs queued or running, the most it may have "
            f"(NOBACKFILL_MAX_ACTIVE_JOBS_PER_TENANT={settings.max_active_jobs_per_tenant}); "
            "wait for one to finish or cancel one",
            slug="too-many-jobs",
            headers={"Retry-After": "30"},
        )


def queued_steps(session: Session, tenant_id: str) -> int:
    """Estimated optimiser steps of the tenant's queued and running jobs (a running job counts
    whole: its progress is the trainer's, not an estimate's)."""
    rows = session.execute(
        select(UpgradeJob.method, UpgradeJob.params, UpgradeJob.eval_fraction, Dataset.count)
        .outerjoin(Dataset, Dataset.id == UpgradeJob.dataset_id)
        .where(UpgradeJob.tenant_id == tenant_id, UpgradeJob.status.in_((QUEUED, RUNNING)))
    ).all()
    return sum(
        estimated_steps(method, params, count or 0, eval_fraction)
        for method, params, eval_fraction, count in rows
    )


def check_steps_quota(session: Session, settings: Settings, tenant_id: str, steps: int) -> None:
    """What one tenant may line up for the shared workers, in estimated optimiser steps
    (``app.upgrades.cost``): the job count alone let four jobs of 1000 epochs × 1000 batches
    hold the queue (issue 45 item 5). 422 for one job that can never fit, 429 while the
    tenant's other jobs hold too much."""
    cap = settings.max_queued_job_steps_per_tenant
    setting = f"NOBACKFILL_MAX_QUEUED_JOB_STEPS_PER_TENANT={cap}"
    if steps > cap:
        raise invalid(
            "params",
            f"this upgrade is estimated at {steps:,} optimiser steps, more than one tenant may "
            f"have queued or running ({setting}); fewer epochs or batches per epoch fit",
        )
    held = queued_steps(session, tenant_id)
    if held + steps > cap:
        raise Problem(
            429,
            "Too many requests",
            f"this upgrade is estimated at {steps:,} optimiser steps and this tenant's queued "
            f"and running jobs at {held:,}, more than it may have together ({setting}); wait "
            "for one to finish or cancel one",
            slug="too-many-job-steps",
            headers={"Retry-After": "60"},
        )


def create_upgrade(
    session: Session, settings: Settings, tenant_id: str, request: UpgradeCreate
) -> UpgradeJob:
    _check_quotas(session, settings, tenant_id, request.params or {})
    dataset = get_dataset(session, tenant_id, request.dataset_id)
    params = dict(request.params or {})
    if request.method in backbone.METHODS:
        gallery_id = _validate_backbone(session, tenant_id, request, dataset)
        if request.objective is not None:
            params[backbone.OBJECTIVE_PARAM] = request.objective
        if not request.old_model_available:
            params[backbone.OLD_MODEL_PARAM] = False
    elif request.method in continual.METHODS:
        if request.objective is not None:
            raise invalid("objective", "continual upgrades have no objective to choose")
        if not request.old_model_available:
            raise invalid("old_model_available", "continual upgrades have no verdict to shape")
        if request.gallery_id is not None:
            raise invalid("gallery_id", "continual upgrades search galleries of their lineage")
        base = (
            get_model(session, tenant_id, request.base_model_id) if request.base_model_id else None
        )
        continual.validate(session, base, dataset, request.params or {})
        gallery_id = None
    else:
        choices = [*backbone.METHODS, *continual.METHODS]
        raise invalid("method", f"unknown method {request.method!r}, expected one of {choices}")
    # After validation: the estimate reads the parameters the trainer accepted.
    steps = estimated_steps(request.method, params, dataset.count, request.eval_fraction)
    check_steps_quota(session, settings, tenant_id, steps)
    job = UpgradeJob(
        id=new_id("upg"),
        tenant_id=tenant_id,
        method=request.method,
        dataset_id=dataset.id,
        gallery_id=gallery_id,
        base_model_id=request.base_model_id,
        params=params,
        seed=request.seed,
        eval_fraction=request.eval_fraction,
        status=QUEUED,
        progress={},
    )
    session.add(job)
    return job


def cancel_upgrade(session: Session, job: UpgradeJob) -> UpgradeJob:
    """Queued → cancelled at once; running → flagged, the trainer stops within one epoch."""
    if job.status in TERMINAL:
        raise conflict(f"upgrade {job.id} is already {job.status}")
    job = session.scalar(select(UpgradeJob).where(UpgradeJob.id == job.id).with_for_update())
    job.cancel_requested = True
    if job.status == QUEUED:
        job.status = CANCELLED
        job.finished_at = utcnow()
    session.commit()
    return job


def is_stale(job: UpgradeJob, stale_after_s: float, now: datetime | None = None) -> bool:
    """A running job whose worker has not beaten for ``stale_after_s``: probably gone (the
    sweeper re-queues or fails it; until then its status still reads "running")."""
    if job.status != RUNNING:
        return False
    if job.heartbeat_at is None:
        return True
    beat = job.heartbeat_at if job.heartbeat_at.tzinfo else job.heartbeat_at.replace(tzinfo=UTC)
    return ((now or utcnow()) - beat).total_seconds() > stale_after_s


def upgrade_out(job: UpgradeJob, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> dict[str, Any]:
    return {
        "id": job.id,
        "status": job.status,
        "method": job.method,
        "dataset_id": job.dataset_id,
        "gallery_id": job.gallery_id,
        "base_model_id": job.base_model_id,
        "params": job.params,
        "seed": job.seed,
        "eval_fraction": job.eval_fraction,
        "progress": job.progress or {},
        "model_id": job.model_id,
        "report": job.report,
        "error": job.error,
        "attempts": job.attempts,
        "cancel_requested": job.cancel_requested,
        "heartbeat_at": job.heartbeat_at,
        "stale": is_stale(job, stale_after_s),
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }


def is_active(job: UpgradeJob) -> bool:
    return job.status in (QUEUED, RUNNING)
