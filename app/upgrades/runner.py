"""Job runners: where upgrade jobs execute. The job row is the truth; a runner is transport.

- ``inline``: runs the job in the calling thread, after the creating request committed (tests).
- ``thread``: ``job_threads`` slots inside the API process (the embedded default), started in
  the lifespan; a free slot runs the fairest job (``executor.run_next``), not the oldest.
- ``celery``: a message per job to the Redis broker; ``worker/`` runs the fairest job per message.

Every runner also sweeps: jobs still queued (a lost message, a restart, a tenant at its running
cap) are submitted again and jobs whose worker stopped beating are handed to ``execute`` (through
``run_next``, which counts them among the jobs a slot may start), which retries or fails them.
"""

from __future__ import annotations

import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from sqlalchemy import or_, select, update

from app.core.db import Database, utcnow
from app.core.settings import Settings
from app.jobs.models import QUEUED, RUNNING, UpgradeJob
from app.upgrades.executor import Claim, execute, run_next, worker_name

log = logging.getLogger(__name__)


class JobRunner:
    name = "base"

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    def submit(self, job_id: str) -> None:
        raise NotImplementedError

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, *, sweep: bool = True) -> None:
        self.recover()
        if sweep:
            self._sweeper = threading.Thread(
                target=self._sweep_loop, name="job-sweeper", daemon=True
            )
            self._sweeper.start()

    def stop(self) -> None:
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)

    # -- recovery -------------------------------------------------------------------------------
    def recover(self) -> None:
        """At start: submit every queued job again (messages may be lost; duplicates are no-ops)."""
        for job_id in self._job_ids(QUEUED):
            self.submit(job_id)

    def sweep(self) -> list[str]:
        """Submit jobs queued for longer than the stale time and jobs whose worker went quiet."""
        stale_before = utcnow() - timedelta(seconds=self.settings.job_stale_after_s)
        with self.db.session() as session:
            ids = list(
                session.scalars(
                    select(UpgradeJob.id).where(
                        or_(
                            (UpgradeJob.status == QUEUED) & (UpgradeJob.created_at < stale_before),
                            (UpgradeJob.status == RUNNING)
                            & (
                                UpgradeJob.heartbeat_at.is_(None)
                                | (UpgradeJob.heartbeat_at < stale_before)
                            ),
                        )
                    )
                )
            )
        for job_id in ids:
            self.submit(job_id)
        return ids

    def _job_ids(self, status: str) -> list[str]:
        with self.db.session() as session:
            return list(
                session.scalars(
                    select(UpgradeJob.id).where(UpgradeJob.status == status).order_by(UpgradeJob.id)
                )
            )

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.settings.job_sweep_interval_s):
            try:
                self.sweep()
            except Exception:
                log.exception("job sweep failed")


class InlineRunner(JobRunner):
    """Runs the job before ``submit`` returns (tests; never the embedded default)."""

    name = "inline"

    def submit(self, job_id: str) -> None:
        execute(self.db, self.settings, job_id, worker=worker_name(self.name), stop=self._stop)


class ThreadRunner(JobRunner):
    """``job_threads`` slots in the API process. A submitted job is not queued in the pool (a
    FIFO there let one tenant's burst run before everyone else's jobs): ``submit`` wakes a slot,
    and a slot runs the fairest runnable job from the database until none is left. Shutdown asks
    running trainers to stop between steps and their jobs go back to the queue for the next
    start."""

    name = "thread"

    def __init__(self, db: Database, settings: Settings) -> None:
        super().__init__(db, settings)
        self._pool = ThreadPoolExecutor(settings.job_threads, thread_name_prefix="upgrade")
        self._lock = threading.Lock()
        self._slots = 0  # slots looking for or running jobs
        # Set by every submit, cleared by a slot before it looks: a slot that found nothing
        # looks again if a job came meanwhile (else that job would wait for the sweeper).
        self._wake = False

    def recover(self) -> None:
        # This process is the only thread runner on its database: jobs left running by an
        # earlier process of this host died with it, so they need not wait to look stale.
        prefix = f"{self.name}:{socket.gethostname()}:"
        with self.db.session() as session:
            session.execute(
                update(UpgradeJob)
                .where(UpgradeJob.status == RUNNING, UpgradeJob.worker.startswith(prefix))
                .values(heartbeat_at=None)
            )
        for job_id in self._job_ids(RUNNING):
            self.submit(job_id)
        super().recover()

    def submit(self, job_id: str) -> None:
        """``job_id`` only says there is work: the slot runs whichever job is fairest."""
        with self._lock:
            if self._stop.is_set():
                return
            self._wake = True
            if self._slots >= self.settings.job_threads:
                return  # every slot is busy; the first to finish looks again
            self._slots += 1
        self._pool.submit(self._slot)

    def _slot(self) -> None:
        worker = worker_name(self.name)
        while True:
            with self._lock:
                self._wake = False
            try:
                ran = run_next(self.db, self.settings, worker=worker, stop=self._stop)
            except Exception:
                log.exception("job slot: runner error")
                ran = Claim.DONE
            with self._lock:
                if self._stop.is_set() or (ran is not Claim.CLAIMED and not self._wake):
                    self._slots -= 1
                    return

    def stop(self) -> None:
        super().stop()
        self._pool.shutdown(wait=True, cancel_futures=True)


class CeleryRunner(JobRunner):
    """One message per submit; a broker outage leaves the row queued for the sweeper."""

    name = "celery"

    def __init__(self, db: Database, settings: Settings) -> None:
        super().__init__(db, settings)
        from app.upgrades.broker import make_celery

        self._celery = make_celery(settings)
        # The API only publishes: a publish fails at once when the broker is down (kombu's
        # Redis transport retried the connection for about 2 s per attempt) and the sweeper
        # resends. Workers keep the default reconnects (they use their own make_celery).
        self._celery.conf.broker_transport_options = {
            **self._celery.conf.broker_transport_options,
            "max_retries": 0,
            # A broker that accepts connections and never answers (paused, overloaded,
            # half-dead) must not hold the request either.
            "socket_connect_timeout": 0.5,
            "socket_timeout": 0.5,
        }

    def submit(self, job_id: str) -> None:
        from app.upgrades.broker import RUN_UPGRADE

        try:
            # No publish retries: a request must not wait out a broker outage (it blocked
            # POST /v1/upgrades for 25 s); the row stays queued and the sweeper resends it.
            self._celery.send_task(
                RUN_UPGRADE, args=[job_id], queue=self.settings.celery_queue, retry=False
            )
        except Exception as exc:
            log.warning("upgrade %s: broker unavailable (%s); the sweeper will resend", job_id, exc)


def make_runner(db: Database, settings: Settings) -> JobRunner:
    runners = {"inline": InlineRunner, "thread": ThreadRunner, "celery": CeleryRunner}
    return runners[settings.job_runner](db, settings)
