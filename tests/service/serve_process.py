"""``nobackfill serve`` in a process of its own, as an operator runs it (the bounded httptools
protocol, the trusted-proxy rules): for the tests of what uvicorn's options bound."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.common.service import free_port
from tests.service.test_installed_stack import stop, wait_ready


@contextmanager
def nobackfill_serve(data_dir: Path, key: str, **settings: str) -> Iterator[tuple[str, int]]:
    """(URL, port) of a ``nobackfill serve`` on ``data_dir`` with ``key`` as its bootstrap key and
    ``settings`` as NOBACKFILL_* variables (``max_header_bytes="8192"`` →
    NOBACKFILL_MAX_HEADER_BYTES); stopped at the end."""
    port = free_port()
    env = {
        **os.environ,
        "NOBACKFILL_DATA_DIR": str(data_dir),
        "NOBACKFILL_BOOTSTRAP_KEY": key,
        "NOBACKFILL_LOG_LEVEL": "warning",
        **{f"NOBACKFILL_{name.upper()}": value for name, value in settings.items()},
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / f"serve-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log)
        yield url, port
    finally:
        stop(process)
