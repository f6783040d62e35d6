"""Job runners: where upgrade jobs execute. The job row is the truth; a runner is transport.

- ``inline``: runs the job in the calling thread, after the creating request committed (tests).
- ``thread``: ``job_threads`` slots inside the API process (the embedded default), started in
  the lifespan; a free slot runs the fairest job (``executor.run_next``), not the oldest.
- ``celery``: a message per job to the Redis broker; ``worker/`` runs the fairest job per message.

Every runner also sweeps: jobs still queued that a slot could start (a lost message, a restart;
not those a tenant's running cap holds back: they wait for their tenant's job, not a message) are
submitted again and jobs whose worker stopped beating are handed to ``execute`` (through
``run_next``, which counts them among the jobs a slot may start), which retries or fails them.
On Celery a sweep tops the queue up to one message per such job rather than adding to it.
"""

from __future__ import annotations

import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from sqlalchemy import or_, select, update

from app.core.db import Database, utcnow
from app.core.errors import log_background_failure
from app.core.settings import Settings
from app.jobs.models import QUEUED, RUNNING, UpgradeJob
from app.upgrades.executor import Claim, execute, fair_order, run_next, worker_name

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
        """Send again the jobs whose message may be lost and that a free slot could start now:
        queued for longer than the stale time, of a tenant below its running cap, and running
        jobs whose worker went quiet (``fair_order``'s candidates, fairest first). A job held back
        by its tenant's cap is not sent: it has nothing lost, and sending it on every sweep piled
        one no-op message per waiting job into the broker for as long as its tenant's job ran;
        it becomes a candidate (for the finishing slot, or the next sweep) once that job ends."""
        stale_before = utcnow() - timedelta(seconds=self.settings.job_stale_after_s)
        with self.db.sessions() as session:
            startable = fair_order(session, self.settings)
            if not startable:
                return []
            lost = set(
                session.scalars(
                    select(UpgradeJob.id).where(
                        UpgradeJob.id.in_(startable),
                        or_(UpgradeJob.status == RUNNING, UpgradeJob.created_at < stale_before),
                    )
                )
            )
        ids = [job_id for job_id in startable if job_id in lost]
        self._resend(ids)
        return ids

    def _resend(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self.submit(job_id)

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
            except Exception as exc:
                log_background_failure(log, "job sweep failed", exc)


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
            except Exception as exc:
                log_background_failure(log, "job slot: runner error", exc)
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
            "socket_connect_timeout": settings.redis_connect_timeout_s,
            "socket_timeout": settings.redis_socket_timeout_s,
        }

    def _resend(self, job_ids: list[str]) -> None:
        """Top the queue up to one message per job instead of adding to it: a message only says
        "a slot may have work" (the worker runs the fairest job), and while every worker is busy
        each sweep would add one per waiting job, to be drained as no-ops later."""
        pending = self._pending_messages()
        for job_id in job_ids[pending:]:
            self.submit(job_id)

    def _pending_messages(self) -> int:
        """Messages waiting in the queue (not yet taken by a worker); 0 when Redis cannot say,
        so that the sends are tried (and fail as fast) as without the check."""
        import redis

        client = redis.Redis.from_url(
            self.settings.redis_url,
            socket_connect_timeout=self.settings.redis_connect_timeout_s,
            socket_timeout=self.settings.redis_socket_timeout_s,
        )
        try:
            return int(client.llen(self.settings.celery_queue))
        except redis.RedisError as exc:
            log.warning("job sweep: cannot read the broker queue's length (%s)", exc)
            return 0
        finally:
            client.close()

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
