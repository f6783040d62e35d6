"""What a benchmark records about the machine it ran on, and the machine's own limits.

Every performance benchmark writes these facts beside its figures: CPU model, cores, library
versions, thread counts and the load average at start and end (a figure taken while other work
kept the cores busy says little about the code).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def gpu_name() -> str | None:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine_facts() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "faiss": faiss.__version__,
        "numpy": np.__version__,
        "torch_threads": torch.get_num_threads(),
        "faiss_threads": faiss.omp_get_max_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def facts_markdown(facts: dict[str, Any], load_start: list[float], load_end: list[float]) -> str:
    gpu = facts["gpu"] or "none"
    return (
        f"Machine: {facts['cpu']}, {facts['cores']} cores, GPU: {gpu}; Python {facts['python']}, "
        f"torch {facts['torch']} ({facts['torch_threads']} threads), faiss {facts['faiss']} "
        f"({facts['faiss_threads']} OpenMP threads), numpy {facts['numpy']}; {facts['date']}. "
        f"Load average (1/5/15 min) at start {load_start}, at end {load_end}."
    )


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of ``repeats`` calls after one warm-up (the machine's limit, not a typical time)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        tic = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - tic)
    return best


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def read_bandwidth(device: torch.device, nbytes: int = 2**30, repeats: int = 5) -> float:
    """Bytes per second of a streaming read of a float32 buffer far larger than any cache (a
    sum over every element, all threads): what a single-query flat scan can at best reach."""
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)

    def run() -> None:
        buffer.sum()
        synchronize(device)

    return nbytes / best_seconds(run, repeats)


def gemm_flops(device: torch.device, size: int = 2048, repeats: int = 5) -> float:
    """Float32 FLOP/s of a large square matrix product: what a batched flat scan can reach."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)

    def run() -> None:
        a @ b
        synchronize(device)

    return 2.0 * size**3 / best_seconds(run, repeats)


def run_record(command: str, started: float, load_start: list[float]) -> dict[str, Any]:
    """What every benchmark's results start with: the command, its wall time since ``started``
    (``time.perf_counter``), the machine and the load average before and after."""
    return {
        "command": command,
        "seconds": time.perf_counter() - started,
        "machine": machine_facts(),
        "load_start": load_start,
        "load_end": load_average(),
    }


def source_state(*watched: str) -> dict[str, Any]:
    """The commit measured and the files under ``watched`` (default ``app``) changed from it
    (uncommitted edits there are part of what was measured), under ``"app_changed"`` whatever
    ``watched`` is, as the results files have always named it."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=30
            ).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = [
        line[3:] for line in git("status", "--porcelain", "--", *(watched or ("app",))).splitlines()
    ]
    return {"commit": git("rev-parse", "HEAD").strip(), "app_changed": changed}


def uncommitted_phrase(changed: list[str]) -> str:
    """`` with uncommitted changes to N file(s)`` for a ``source_state``'s ``app_changed``, or
    nothing when the tree was clean: how a held-back look states what it measured besides its
    commit."""
    if not changed:
        return ""
    return f" with uncommitted changes to {len(changed)} file{'s' * (len(changed) > 1)}"
