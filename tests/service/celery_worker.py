"""A real Celery worker for the tests: a subprocess on the test's database, data directory and a
queue of its own on the local Redis, stopped (and its queue purged) afterwards."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from app.core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("NOBACKFILL_TEST_REDIS", "redis://127.0.0.1:6379/0")


def require_redis() -> None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError:
        if os.environ.get("CI"):
            pytest.fail("Redis at 127.0.0.1:6379 is required in CI (.ci/run starts it)")
        pytest.skip("Redis is not reachable at 127.0.0.1:6379")


def celery_overrides() -> dict:
    """Settings for an app that sends its jobs to a test-private queue."""
    return {
        "job_runner": "celery",
        "redis_url": REDIS_URL,
        "celery_queue": f"nobackfill-test-{os.getpid()}-{secrets.token_hex(4)}",
    }


def worker_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "NOBACKFILL_DATABASE_URL": settings.resolved_database_url,
            "NOBACKFILL_DATA_DIR": str(settings.data_dir),
            "NOBACKFILL_REDIS_URL": settings.redis_url,
            "NOBACKFILL_CELERY_QUEUE": settings.celery_queue,
            "NOBACKFILL_JOB_HEARTBEAT_S": str(settings.job_heartbeat_s),
            "NOBACKFILL_JOB_STALE_AFTER_S": str(settings.job_stale_after_s),
            "NOBACKFILL_JOB_MAX_ATTEMPTS": str(settings.job_max_attempts),
            # Claims are made (and the running cap checked) by the worker.
            "NOBACKFILL_MAX_RUNNING_JOBS_PER_TENANT": str(settings.max_running_jobs_per_tenant),
            # The worker reads and writes the galleries' vectors where the API does.
            "NOBACKFILL_VECTOR_ENGINE": settings.vector_engine,
            "NOBACKFILL_MILVUS_URI": settings.resolved_milvus_uri,
            "NOBACKFILL_MILVUS_TOKEN": settings.milvus_token,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
        }
    )
    return env


@contextmanager
def celery_worker(settings: Settings, log_path: Path) -> Iterator[subprocess.Popen]:
    celery = Path(sys.executable).parent / "celery"
    command = [
        str(celery),
        "-A",
        "worker.celery_app",
        "worker",
        "--pool",
        "solo",
        "--concurrency",
        "1",
        "--queues",
        settings.celery_queue,
        "--hostname",
        f"{settings.celery_queue}@%h",
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        "INFO",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=worker_env(settings), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        redis.Redis.from_url(settings.redis_url).delete(settings.celery_queue)


def wait_for_job(client, job_id: str, timeout: float, worker: subprocess.Popen | None = None):
    """Poll the job resource until it is terminal; fail with the worker's state otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/upgrades/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        if worker is not None and worker.poll() is not None:
            pytest.fail(f"the Celery worker exited with {worker.returncode}")
        time.sleep(0.5)
    pytest.fail(f"job {job_id} still {job['status']} after {timeout}s: {job}")
