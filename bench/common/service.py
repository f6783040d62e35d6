"""The API as a real server process (uvicorn, one worker) for HTTP benchmarks, and a direct
database seed for galleries too large to upload request by request in a benchmark's time."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import select

from bench.common.wordnet import REPO_ROOT

BENCH_KEY = "nbk_benchmark_key_" + "b" * 32


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def service_env(data_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "NOBACKFILL_DATA_DIR": str(data_dir),
        "NOBACKFILL_BOOTSTRAP_KEY": BENCH_KEY,
        "NOBACKFILL_LOCAL_KEY": "false",
        "NOBACKFILL_JOB_RUNNER": "inline",
        "NOBACKFILL_LOG_LEVEL": "warning",
    }
    env.pop("NOBACKFILL_DATABASE_URL", None)
    env.update(extra or {})
    return env


@dataclass
class RunningService:
    url: str
    process: subprocess.Popen
    log_path: Path

    def client(self, timeout: float = 600.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {BENCH_KEY}"},
            timeout=timeout,
        )

    def stop(self) -> None:
        stop_process(self.process)


def stop_process(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within ``timeout`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_service(
    data_dir: Path,
    extra_env: Mapping[str, str] | None = None,
    startup_timeout: float = 900.0,
    cli_serve: bool = False,
) -> RunningService:
    """``uvicorn app.main:create_app`` on a free local port; returns once /healthz answers (the
    startup check may first rebuild a large gallery's index from the database). ``cli_serve``:
    the server as ``nobackfill serve`` runs it instead (uvicorn with the bounded-headers
    protocol of ``app.api.http_protocol``, which the plain ``uvicorn`` command lacks)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = data_dir / "server.log"
    address = ["--host", "127.0.0.1", "--port", str(port)]
    if cli_serve:
        command = [sys.executable, "-m", "app.cli", "serve", *address]
    else:
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "app.main:create_app",
            "--factory",
            *address,
            "--log-level",
            "warning",
            "--no-access-log",
        ]
    # The child writes to its own copy of the log's descriptor; the parent's closes here.
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=service_env(data_dir, extra_env), stdout=log, stderr=log
        )
    service = RunningService(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"server exited ({process.returncode}); {log_path} ends:\n{tail}")
        try:
            if httpx.get(f"{service.url}/healthz", timeout=2).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    service.stop()
    raise TimeoutError(f"server did not answer within {startup_timeout} s; see {log_path}")


def create_gallery(service: RunningService, body: dict[str, Any]) -> str:
    with service.client() as client:
        response = client.post("/v1/galleries", json=body)
        response.raise_for_status()
        return str(response.json()["id"])


def seed_gallery_rows(
    data_dir: Path,
    gallery_id: str,
    item_ids: list[str],
    vectors: np.ndarray,
    chunk: int = 20_000,
    database_url: str | None = None,
) -> None:
    """Store vectors straight through the (stopped) service's vector storage, as committed
    uploads would leave them, one commit per chunk, and bump the gallery's index version: the
    next start rebuilds its index."""
    import app.db_models  # noqa: F401  (the table registry: Database needs every mapped class)
    from app.core.db import Database
    from app.core.settings import Settings
    from app.galleries.models import Gallery
    from app.vectors.storage import storage_for

    settings = Settings(
        _env_file=None, data_dir=data_dir, bootstrap_key=BENCH_KEY, database_url=database_url
    )
    db = Database(settings)
    try:
        with db.session() as session:
            for start in range(0, len(item_ids), chunk):
                gallery = session.scalar(
                    select(Gallery)
                    .where(Gallery.id == gallery_id)
                    .execution_options(populate_existing=True)
                )
                assert gallery is not None
                ids = item_ids[start : start + chunk]
                written = storage_for(session, gallery).upsert(
                    session,
                    gallery,
                    ids,
                    np.ascontiguousarray(vectors[start : start + chunk], dtype=np.float32),
                    [None] * len(ids),
                    [None] * len(ids),
                )
                gallery.count += written.inserted
                gallery.index_version += 1
                # Committed chunk by chunk: the storage reads only committed manifests.
                session.commit()
    finally:
        db.dispose()
