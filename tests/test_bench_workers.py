"""A bench's pool workers end with the bench (a killed bench left orphans training for an hour)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A bench in miniature: a spawned pool with the initializer, a worker busy on a long task, and the
# worker's pid printed for the test.
BENCH = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from bench.common.workers import exit_with_parent

    if __name__ == "__main__":
        use_watch = sys.argv[1] == "watch"
        watch = {"initializer": exit_with_parent, "initargs": (os.getpid(), 0.1)}
        kwargs = watch if use_watch else {}
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), **kwargs)
        print(pool.submit(os.getpid).result(), flush=True)
        pool.submit(time.sleep, 120)
        time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has ended; /proc shows it as state Z until reaped.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[1].startswith("Z"))


def _worker_after_killing_bench(mode: str, wait_s: float) -> tuple[int, bool]:
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH, mode], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert bench.stdout is not None
    worker = int(bench.stdout.readline())
    bench.send_signal(signal.SIGKILL)
    bench.wait()
    deadline = time.monotonic() + wait_s
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(worker)
    if alive:
        os.kill(worker, signal.SIGKILL)
    return worker, alive


def test_pool_worker_ends_when_the_bench_is_killed() -> None:
    _, alive = _worker_after_killing_bench("watch", wait_s=20)
    assert not alive


def test_without_the_initializer_the_worker_is_orphaned() -> None:
    # The control: the failure the initializer exists for is real on this platform.
    _, alive = _worker_after_killing_bench("plain", wait_s=2)
    assert alive
