"""Runs one upgrade job to its end, wherever it runs (thread, inline or Celery worker).

Idempotent by job id: the claim is a conditional UPDATE, so a duplicate delivery runs nothing.
A job whose worker died (no heartbeat for ``job_stale_after_s``) is taken over by the next
delivery, up to ``job_max_attempts`` attempts, then failed with the reason — never left running.
The model artifact is written (atomically, checksummed) before the row that names it commits, and
removed again if that commit does not happen.

Fairness (issue 45 item 5): a free slot runs ``run_next``, the fairest job a claim can start
(``fair_order``: the tenant with the fewest running jobs, then the one whose last start is
oldest, then its oldest job), whatever job a message named; and a claim never starts a job of a
tenant that already runs ``max_running_jobs_per_tenant`` (checked in the claim's UPDATE itself).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

import numpy as np
from sqlalchemy import Select, func, select, update
from sqlalchemy.orm import Session, aliased

from app.auth.models import Tenant
from app.core.db import Database, as_utc, new_id, utcnow
from app.core.errors import database_outage, log_outage
from app.core.settings import Settings
from app.datasets.models import Dataset
from app.galleries import attach
from app.galleries.models import Gallery
from app.jobs.models import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, UpgradeJob
from app.ml.methods.models import model_to_bytes
from app.ml.methods.training import TrainingCancelled, TrainingHooks
from app.models.models import TrainedModel
from app.models.service import artifact_file, store_artifact
from app.upgrades import backbone, continual
from app.upgrades.trained import TrainedOutput

log = logging.getLogger(__name__)
# How often the cancel flag is read from the database at most (the trainer polls per epoch).
CANCEL_POLL_S = 1.0
# While the database does not answer, how often a job it interrupted tries to go back to the queue.
OUTAGE_RETRY_S = 1.0


# Job kinds other than training, by ``method``: run(db, settings, job, hooks) → the job's report.
# Registered by the layer that implements them (``app.migration.reembed_job``), so that the same
# claim, heartbeat, cancel, retry and transport serve every kind of job.
JobKind = Callable[[Database, Settings, UpgradeJob, TrainingHooks], dict[str, Any]]
JOB_KINDS: dict[str, JobKind] = {}


def register_kind(method: str, run: JobKind) -> None:
    JOB_KINDS[method] = run


class Claim(Enum):
    CLAIMED = "claimed"  # this call runs the job
    BUSY = "busy"  # another live worker runs it
    WAITING = "waiting"  # its tenant runs its most jobs at once: it stays queued
    DONE = "done"  # nothing to do (finished, cancelled, failed, gone)


def json_safe(value: Any) -> Any:
    """Trainer output as strict JSON: numpy scalars to Python, NaN/±Inf to null (PostgreSQL's
    JSON type refuses them, and so do strict clients)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def worker_name(runner: str) -> str:
    return f"{runner}:{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _finish(db: Database, job_id: str, worker: str | None, **values: Any) -> bool:
    """Set a terminal (or requeued) state, only if ``worker`` still owns the running job."""
    conditions = [UpgradeJob.id == job_id]
    if worker is not None:
        conditions += [UpgradeJob.status == RUNNING, UpgradeJob.worker == worker]
    with db.session() as session:
        result = session.execute(update(UpgradeJob).where(*conditions).values(**values))
        return result.rowcount == 1


def claim(db: Database, settings: Settings, job_id: str, worker: str) -> Claim:
    with db.session() as session:
        job = session.get(UpgradeJob, job_id)
        if job is None or job.status not in (QUEUED, RUNNING):
            return Claim.DONE
        now = utcnow()
        if job.cancel_requested:
            session.execute(
                update(UpgradeJob)
                .where(UpgradeJob.id == job_id, UpgradeJob.status == job.status)
                .values(status=CANCELLED, finished_at=now)
            )
            return Claim.DONE
        stale_before = now - timedelta(seconds=settings.job_stale_after_s)
        if job.status == RUNNING:
            beat = job.heartbeat_at
            if beat is not None and as_utc(beat) > stale_before:
                return Claim.BUSY
            if job.attempts >= settings.job_max_attempts:
                session.execute(
                    update(UpgradeJob)
                    .where(UpgradeJob.id == job_id, UpgradeJob.attempts == job.attempts)
                    .values(
                        status=FAILED,
                        finished_at=now,
                        error=(
                            f"the worker running attempt {job.attempts} stopped responding "
                            f"({job.worker}); gave up after {job.attempts} attempts"
                        ),
                    )
                )
                return Claim.DONE
        _hold_tenant(session, job.tenant_id)
        # A takeover replaces the dead worker's slot, so the job itself is not counted.
        others = _running_besides(job.tenant_id, job_id)
        # Conditional on what was read: of two concurrent claimers exactly one updates the row;
        # and on the tenant's running jobs, in the same statement, so that no transport (a
        # duplicate message, a second worker) starts a job beyond the tenant's cap.
        result = session.execute(
            update(UpgradeJob)
            .where(
                UpgradeJob.id == job_id,
                UpgradeJob.status == job.status,
                UpgradeJob.attempts == job.attempts,
                others.scalar_subquery() < settings.max_running_jobs_per_tenant,
            )
            .values(
                status=RUNNING,
                attempts=job.attempts + 1,
                worker=worker,
                started_at=now,
                heartbeat_at=now,
                error=None,
            )
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:
            if job.status == RUNNING:
                log.warning(
                    "upgrade %s: worker %s stopped responding; retrying", job_id, job.worker
                )
            return Claim.CLAIMED
        if session.scalar(others) >= settings.max_running_jobs_per_tenant:
            return Claim.WAITING
        return Claim.BUSY


def _running_besides(tenant_id: str, job_id: str) -> Select[tuple[int]]:
    """How many other jobs of the tenant are running (a dead worker's included, until its job
    is taken over or failed: the tenant's slot is not freed by a worker going quiet)."""
    other = aliased(UpgradeJob)
    return (
        select(func.count())
        .select_from(other)
        .where(other.tenant_id == tenant_id, other.status == RUNNING, other.id != job_id)
    )


def _hold_tenant(session: Session, tenant_id: str) -> None:
    """Serialise the claims of one tenant on PostgreSQL, so that the running count in the next
    statement (a new snapshot under READ COMMITTED) includes any claim that committed while this
    one waited: two claims of one tenant could each see the other's job still queued. NO KEY
    UPDATE: it does not block rows being inserted that reference the tenant. SQLite runs the
    UPDATE and its count under the database's one write lock, which is enough."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(
            select(Tenant.id).where(Tenant.id == tenant_id).with_for_update(key_share=True)
        )


_NEVER = datetime.min.replace(tzinfo=UTC)


def fair_order(session: Session, settings: Settings) -> list[str]:
    """The jobs a free slot may start, fairest first: queued jobs of tenants below their running
    cap and running jobs whose worker went quiet (a takeover), ordered by their tenant's
    running jobs (fewest first), then its last start (oldest, or none, first: round-robin
    across tenants), then the job's age (a tenant's own jobs run in the order it queued them).
    Only ordering: the claim decides (a row may change meanwhile)."""
    cap = settings.max_running_jobs_per_tenant
    stale_before = utcnow() - timedelta(seconds=settings.job_stale_after_s)
    rows = session.execute(
        select(
            UpgradeJob.id,
            UpgradeJob.tenant_id,
            UpgradeJob.status,
            UpgradeJob.heartbeat_at,
            UpgradeJob.created_at,
        ).where(UpgradeJob.status.in_((QUEUED, RUNNING)))
    ).all()
    running = Counter(row.tenant_id for row in rows if row.status == RUNNING)

    def quiet(row: Any) -> bool:  # claim()'s rule for a worker that stopped beating
        return row.heartbeat_at is None or as_utc(row.heartbeat_at) <= stale_before

    candidates = [
        row
        for row in rows
        if (row.status == QUEUED and running[row.tenant_id] < cap)
        or (row.status == RUNNING and quiet(row))
    ]
    if not candidates:
        return []
    tenants = {row.tenant_id for row in candidates}
    last_start = dict(
        session.execute(
            select(UpgradeJob.tenant_id, func.max(UpgradeJob.started_at))
            .where(UpgradeJob.tenant_id.in_(tenants))
            .group_by(UpgradeJob.tenant_id)
        ).all()
    )

    def key(row: Any) -> tuple[int, datetime, datetime, str]:
        started = last_start.get(row.tenant_id)
        own = running[row.tenant_id] - (row.status == RUNNING)
        return (own, as_utc(started) if started else _NEVER, as_utc(row.created_at), row.id)

    return [row.id for row in sorted(candidates, key=key)]


class _JobHooks:
    """Progress into the row, cancellation from the row (or the runner's shutdown event), and a
    heartbeat thread so a long epoch never looks like a dead worker."""

    def __init__(
        self, db: Database, settings: Settings, job_id: str, worker: str, stop: threading.Event
    ) -> None:
        self.db, self.job_id, self.worker, self.stop = db, job_id, worker, stop
        self.interval = settings.job_heartbeat_s
        self._done = threading.Event()
        self._last_poll = 0.0
        self._cancelled = False
        self.max_seconds = settings.job_max_seconds
        self.started = time.monotonic()
        self.timed_out = False
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job_id}", daemon=True)

    def __enter__(self) -> TrainingHooks:
        self._thread.start()
        return TrainingHooks(progress=self.progress, should_stop=self.should_stop)

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _owned(self):
        return (
            UpgradeJob.id == self.job_id,
            UpgradeJob.status == RUNNING,
            UpgradeJob.worker == self.worker,
        )

    def _beat(self) -> None:
        while not self._done.wait(self.interval):
            try:
                with self.db.session() as session:
                    session.execute(
                        update(UpgradeJob).where(*self._owned()).values(heartbeat_at=utcnow())
                    )
            except Exception as exc:
                if database_outage(exc) is None:
                    log.exception("upgrade %s: heartbeat failed", self.job_id)
                else:
                    log_outage("upgrade %s: heartbeat not written: %s", self.job_id, exc)

    def progress(self, values: dict[str, Any]) -> None:
        """The trainer's report into the row. Best effort while the database does not answer
        (as the heartbeat and the cancel poll are): a short outage must not end a training
        that does not need the database until it stores its model; the next report catches up."""
        clean = json_safe(values)
        try:
            with self.db.session() as session:
                session.execute(
                    update(UpgradeJob)
                    .where(*self._owned())
                    .values(progress=clean, heartbeat_at=utcnow())
                )
        except Exception as exc:
            if database_outage(exc) is None:
                raise
            log_outage("upgrade %s: progress not written: %s", self.job_id, exc)

    def cancel_requested(self) -> bool:
        with self.db.session() as session:
            return bool(
                session.scalar(
                    select(UpgradeJob.cancel_requested).where(UpgradeJob.id == self.job_id)
                )
            )

    def should_stop(self) -> bool:
        if self.stop.is_set() or self._cancelled or self.timed_out:
            return True
        now = time.monotonic()
        if now - self.started > self.max_seconds:
            self.timed_out = True
            return True
        if now - self._last_poll >= CANCEL_POLL_S:
            self._last_poll = now
            try:
                self._cancelled = self.cancel_requested()
            except Exception as exc:  # read again at the next poll, as ``progress`` says
                if database_outage(exc) is None:
                    raise
                log_outage("upgrade %s: cancel flag not read: %s", self.job_id, exc)
        return self._cancelled


def _train(
    db: Database, settings: Settings, job: UpgradeJob, hooks: TrainingHooks
) -> TrainedOutput:
    """Read the inputs in a short session, then train without holding one."""
    if job.method in continual.METHODS:
        with db.session() as session:
            inputs = continual.load_inputs(session, settings, job)
        return continual.train(job, inputs, hooks)
    if job.method not in backbone.METHODS:
        raise ValueError(f"unknown method {job.method!r}")
    with db.session() as session:
        dataset = session.get(Dataset, job.dataset_id) if job.dataset_id else None
        if dataset is None:
            raise ValueError("the dataset of this upgrade was deleted")
        gallery = session.get(Gallery, job.gallery_id) if job.gallery_id else None
        if gallery is None:
            raise ValueError("the gallery of this upgrade was deleted")
        collection = attach.recheck(session, settings, gallery)
        if collection is not None:
            session.commit()
            loaded_from = {"collection": collection}
        else:
            loaded_from = {}
        data, loaded = backbone.load_inputs(session, dataset, gallery)
        session.expunge(gallery)
    out = backbone.train(
        job.method,
        data,
        gallery,
        params=job.params,
        seed=job.seed,
        eval_fraction=job.eval_fraction,
        hooks=hooks,
    )
    return replace(out, report={**loaded_from, **loaded, **out.report})


def _set_phase(db: Database, job_id: str, worker: str, phase: str) -> None:
    """Mark what the job does now, keeping the trainer's latest progress beside it."""
    with db.session() as session:
        current = session.scalar(select(UpgradeJob.progress).where(UpgradeJob.id == job_id))
        session.execute(
            update(UpgradeJob)
            .where(
                UpgradeJob.id == job_id, UpgradeJob.status == RUNNING, UpgradeJob.worker == worker
            )
            .values(progress={**(current or {}), "phase": phase}, heartbeat_at=utcnow())
        )


def _store(db: Database, settings: Settings, job: UpgradeJob, worker: str, out: TrainedOutput):
    """Artifact files first, then one transaction: the model row and the job's success."""
    model_id = new_id("mdl")
    blob = model_to_bytes(out.model)
    artifact, sha, size = store_artifact(settings, f"{model_id}.pt", blob)
    files = [artifact]
    state_path = state_sha = None
    if out.state is not None:
        state_path, state_sha, _ = store_artifact(settings, f"{model_id}.state", out.state)
        files.append(state_path)
    model = out.model
    row = TrainedModel(
        id=model_id,
        tenant_id=job.tenant_id,
        kind=out.kind,
        method=out.method or job.method,
        upgrade_id=job.id,
        parent_id=out.parent_id,
        root_id=out.root_id or model_id,
        depth=out.depth,
        modalities=list(model.modalities),
        input_dims={m: int(model.input_dim(m)) for m in model.modalities},
        output_dim=int(model.output_dim),
        curv=float(model.curv),
        rotation=(
            None if out.rotation is None else np.asarray(out.rotation, dtype="<f8").tobytes()
        ),
        artifact_path=artifact,
        artifact_sha256=sha,
        artifact_bytes=size,
        state_path=state_path,
        state_sha256=state_sha,
        **out.space,
    )
    try:
        with db.session() as session:
            session.add(row)
            session.flush()
            result = session.execute(
                update(UpgradeJob)
                .where(
                    UpgradeJob.id == job.id,
                    UpgradeJob.status == RUNNING,
                    UpgradeJob.worker == worker,
                )
                .values(
                    status=SUCCEEDED,
                    model_id=model_id,
                    report=json_safe(out.report),
                    params=json_safe({**job.params, **out.params}),
                    finished_at=utcnow(),
                )
            )
            if result.rowcount != 1:
                raise RuntimeError("the job was taken over by another worker")
    except BaseException:
        for name in files:
            artifact_file(settings, name).unlink(missing_ok=True)
        raise
    return model_id


def execute(
    db: Database,
    settings: Settings,
    job_id: str,
    *,
    worker: str,
    stop: threading.Event | None = None,
) -> Claim:
    """Claim and run ``job_id``; returns how the claim went (the row holds the outcome)."""
    stop = stop or threading.Event()
    outcome = claim(db, settings, job_id, worker)
    if outcome is not Claim.CLAIMED:
        return outcome
    with db.session() as session:
        job = session.get(UpgradeJob, job_id)
        session.expunge(job)
    log.info("upgrade %s (%s): attempt %d on %s", job_id, job.method, job.attempts, worker)
    monitor = _JobHooks(db, settings, job_id, worker, stop)
    try:
        kind = JOB_KINDS.get(job.method)
        if kind is not None:
            with monitor as hooks:
                report = kind(db, settings, job, hooks)
            _finish(
                db,
                job_id,
                worker,
                status=SUCCEEDED,
                report=json_safe(report),
                finished_at=utcnow(),
            )
            log.info("%s %s succeeded", job.method, job_id)
            return Claim.CLAIMED
        with monitor as hooks:
            out = _train(db, settings, job, hooks)
            hooks.check()
        _set_phase(db, job_id, worker, "storing")
        model_id = _store(db, settings, job, worker, out)
        log.info("upgrade %s succeeded: model %s", job_id, model_id)
    except TrainingCancelled:
        if monitor.timed_out:
            error = (
                f"stopped after {settings.job_max_seconds:g} s, the time an upgrade may run "
                "(NOBACKFILL_JOB_MAX_SECONDS)"
            )
            _finish(db, job_id, worker, status=FAILED, error=error, finished_at=utcnow())
            log.info("upgrade %s timed out", job_id)
        elif monitor.cancel_requested():
            _finish(db, job_id, worker, status=CANCELLED, finished_at=utcnow())
            log.info("upgrade %s cancelled", job_id)
        else:
            # The runner is shutting down: hand the job back without spending an attempt.
            _finish(db, job_id, worker, status=QUEUED, attempts=job.attempts - 1, heartbeat_at=None)
            log.info("upgrade %s interrupted by shutdown; queued again", job_id)
    except (ValueError, TypeError, KeyError) as exc:
        _finish(db, job_id, worker, status=FAILED, error=str(exc), finished_at=utcnow())
        log.info("upgrade %s failed: %s", job_id, exc)
    except Exception as exc:
        if database_outage(exc) is not None:
            _requeue_after_outage(db, settings, job, worker, exc, stop)
            return Claim.CLAIMED
        log.exception("upgrade %s crashed", job_id)
        detail = "".join(traceback.format_exception_only(exc)).strip()
        _finish(db, job_id, worker, status=FAILED, error=detail, finished_at=utcnow())
    return Claim.CLAIMED


def _requeue_after_outage(
    db: Database,
    settings: Settings,
    job: UpgradeJob,
    worker: str,
    exc: Exception,
    stop: threading.Event,
) -> None:
    """The database stopped answering under a running job (wedged, restarting, out of
    connections): not the job's fault, so not a failure (issue 45, the soak bench: a 5 s wedge
    failed every job that was running). The job goes back to the queue as soon as the database
    answers again; the attempt counts, so ``job_max_attempts`` still bounds a job that keeps
    meeting outages (its last attempt fails, saying why). Tried for ``job_stale_after_s`` at
    most, and not past the runner's shutdown: the job is then left running without a
    heartbeat, and taken over as a dead worker's job would be."""
    reason = "".join(traceback.format_exception_only(exc)).strip()
    if job.attempts >= settings.job_max_attempts:
        values: dict[str, Any] = {
            "status": FAILED,
            "finished_at": utcnow(),
            "error": f"the database stopped answering during attempt {job.attempts} of "
            f"{settings.job_max_attempts} (NOBACKFILL_JOB_MAX_ATTEMPTS): {reason}",
        }
    else:
        values = {"status": QUEUED, "heartbeat_at": None}
    log_outage(
        "upgrade %s: the database stopped answering (%s); %s", job.id, reason, values["status"]
    )
    deadline = time.monotonic() + settings.job_stale_after_s
    while True:
        try:
            _finish(db, job.id, worker, **values)
            return
        except Exception as again:
            if database_outage(again) is None or time.monotonic() >= deadline or stop.is_set():
                raise
        stop.wait(OUTAGE_RETRY_S)


def run_next(
    db: Database,
    settings: Settings,
    *,
    worker: str,
    stop: threading.Event | None = None,
    hint: str | None = None,
) -> Claim:
    """Run the fairest job this slot can start (``fair_order``) to its end. A message naming
    ``hint`` only says a slot may have work: the job that runs is the fair one, so that the order
    messages were sent in (one tenant's burst first) does not decide.

    CLAIMED: a job ran. BUSY: none could start and ``hint`` runs on a live worker (the caller
    may look again once that worker's heartbeat would be stale). DONE: none could start."""
    with db.sessions() as session:
        order = fair_order(session, settings)
    for job_id in order:
        if stop is not None and stop.is_set():
            break
        # Another slot may claim a job between the ordering and its claim: try the next one.
        if execute(db, settings, job_id, worker=worker, stop=stop) is Claim.CLAIMED:
            return Claim.CLAIMED
    if hint is not None:
        with db.sessions() as session:
            if session.scalar(select(UpgradeJob.status).where(UpgradeJob.id == hint)) == RUNNING:
                return Claim.BUSY
    return Claim.DONE
