"""API process memory against gallery size: the FAISS engine (every gallery's index in the API
process) and a Milvus server (``NOBACKFILL_VECTOR_ENGINE=milvus``, the collections in another
process), one run per engine.

    python -m bench.perf.api_memory                          # 10k … 250k rows + BENCHMARKS.md
    python -m bench.perf.api_memory --sizes 10000 100000 250000 500000
    python -m bench.perf.api_memory --quick                  # 1k / 2k / 4k rows, no BENCHMARKS section

Per engine: a fresh data directory, the API as a real server process (``uvicorn
app.main:create_app``: embedded SQLite, thread runner, OMP_NUM_THREADS=1) and, for Milvus, a
milvus-lite gRPC server process (``python -m milvus_lite server``) that the API reaches as a remote
Milvus at ``http://127.0.0.1:<port>``. One cosine gallery (the default flat index) is filled
through the HTTP API with multipart ``.npy`` uploads of ``--batch`` rows, up to each size in turn;
at each size a few searches run and the resident memory (VmRSS) of the API process and of the
Milvus server (its process tree) is read from ``/proc``. The first size is the warm-up: it absorbs
the one-off costs (imports, the first requests and searches, the allocator's per-thread arenas as
the server's threads take their first requests). Growth per 100k rows is the least-squares slope
of RSS over rows from the second size to the last.

Data: the WordNet-noun MiniLM rows tiled with small noise (``bench.common.tiled``; real-data-derived).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.service import RunningService, free_port, npy_bytes, start_service, stop_process
from bench.common.tiled import tiled, wordnet_rows
from bench.common.wordnet import REPO_ROOT, quick_data_dir

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.api_memory"
TITLE = "API process memory against gallery size (bench.perf.api_memory)"
SIZES = (10_000, 50_000, 100_000, 150_000, 200_000, 250_000)
QUICK_SIZES = (1_000, 2_000, 4_000)
ENGINES = ("faiss", "milvus")
K = 10
SEARCHES = 5
SEARCH_BATCH = 16
# The target: the API process's memory no longer grows with gallery size under Milvus.
# "No longer grows" read as: under Milvus, growth per 100k rows at most this fraction of FAISS's.
TARGET_FRACTION = 0.05


def rss_mib(pid: int) -> float:
    """Resident memory of one process (VmRSS), MiB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (a server may fork helpers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                # The command name may hold spaces: the parent pid follows its closing paren.
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def tree_rss_mib(root: int) -> float:
    total = 0.0
    for pid in tree_pids(root):
        # A helper may exit between the listing and the read.
        with suppress(OSError, RuntimeError):
            total += rss_mib(pid)
    return total


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"milvus-lite server exited ({process.returncode}); see {log}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"milvus-lite server did not listen within {timeout} s; see {log}")


@contextmanager
def milvus_server(data_dir: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A milvus-lite gRPC server process on a free port: (its URI, the process)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = data_dir.parent / "milvus.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "milvus_lite",
                "server",
                "--data-dir",
                str(data_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, process, log_path)
        yield f"http://127.0.0.1:{port}", process
    finally:
        stop_process(process)


def upload(client: httpx.Client, gallery_id: str, vectors: np.ndarray, first: int) -> None:
    ids = np.array([f"w{i}" for i in range(first, first + len(vectors))])
    files = {
        "ids": ("ids.npy", npy_bytes(ids), "application/octet-stream"),
        "vectors": ("v.npy", npy_bytes(vectors), "application/octet-stream"),
    }
    response = client.post(f"/v1/galleries/{gallery_id}/vectors", files=files)
    response.raise_for_status()


def searches(client: httpx.Client, gallery_id: str, queries: np.ndarray) -> float:
    """``SEARCHES`` searches of ``SEARCH_BATCH`` queries; the median seconds of one."""
    times = []
    for call in range(SEARCHES):
        part = queries[call * SEARCH_BATCH : (call + 1) * SEARCH_BATCH]
        tic = time.perf_counter()
        response = client.post(
            f"/v1/galleries/{gallery_id}/search", json={"vectors": part.tolist(), "k": K}
        )
        times.append(time.perf_counter() - tic)
        response.raise_for_status()
        results = response.json()["results"]
        assert len(results) == len(part) and all(len(row) == K for row in results), results
    return float(np.median(times))


def slope_per_100k(rows: Sequence[int], mib: Sequence[float]) -> float | None:
    """MiB per 100k rows: the least-squares slope, the first (warm-up) size left out."""
    if len(rows) < 3:
        return None
    x, y = np.asarray(rows[1:], float), np.asarray(mib[1:], float)
    return float(np.polyfit(x, y, 1)[0] * 100_000)


def slope_error_per_100k(rows: Sequence[int], mib: Sequence[float]) -> float | None:
    """The slope's standard error (MiB per 100k rows): RSS moves between steps by more than the
    rows added (allocator caches, transient request buffers), and the error says how much of a
    small slope that noise could account for. Needs three points after the warm-up."""
    if len(rows) < 4:
        return None
    x, y = np.asarray(rows[1:], float), np.asarray(mib[1:], float)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    variance = float(residual @ residual) / (len(x) - 2)
    return float(np.sqrt(variance / float(((x - x.mean()) ** 2).sum())) * 100_000)


def growth_of(steps: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Per measured process (``api``, ``milvus``): slope and its standard error per 100k rows."""
    rows = [s["rows"] for s in steps]
    growth: dict[str, float | None] = {}
    for process in ("api", "milvus"):
        if steps and f"{process}_mib" in steps[0]:
            mib = [s[f"{process}_mib"] for s in steps]
            growth[f"{process}_mib_per_100k"] = slope_per_100k(rows, mib)
            growth[f"{process}_error_per_100k"] = slope_error_per_100k(rows, mib)
    return growth


# Where the Milvus engine's server comes from: a context manager of a data folder giving (its
# URI, its process, or None where it runs elsewhere: its memory is then not measured).
MilvusAt = Callable[[Path], AbstractContextManager[tuple[str, subprocess.Popen | None]]]


def engine_run(
    engine: str,
    vectors: np.ndarray,
    queries: np.ndarray,
    sizes: Sequence[int],
    batch: int,
    milvus_at: MilvusAt | None = None,
) -> dict[str, Any]:
    """``milvus_at``: the Milvus engine's server (default: a milvus-lite gRPC server process,
    ``milvus_server``; ``bench.perf.milvus_server`` passes a real one)."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-api-memory-{engine}-"))
    env = {"NOBACKFILL_JOB_RUNNER": "thread", "OMP_NUM_THREADS": "1"}
    try:
        with _maybe_milvus(engine, root, milvus_at or milvus_server) as (uri, milvus):
            if uri is not None:
                env.update(NOBACKFILL_VECTOR_ENGINE="milvus", NOBACKFILL_MILVUS_URI=uri)
            service = start_service(root / "data", env)
            try:
                return fill_and_measure(service, milvus, vectors, queries, sizes, batch)
            finally:
                service.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def _maybe_milvus(
    engine: str, root: Path, milvus_at: MilvusAt
) -> Iterator[tuple[str | None, subprocess.Popen | None]]:
    if engine == "faiss":
        yield None, None
        return
    with milvus_at(root / "milvus") as (uri, process):
        yield uri, process


def fill_and_measure(
    service: RunningService,
    milvus: subprocess.Popen | None,
    vectors: np.ndarray,
    queries: np.ndarray,
    sizes: Sequence[int],
    batch: int,
) -> dict[str, Any]:
    pid = service.process.pid
    steps = []
    with service.client() as client:
        created = client.post(
            "/v1/galleries",
            json={"name": "memory", "dim": vectors.shape[1], "model_name": "m", "metric": "cosine"},
        )
        created.raise_for_status()
        gallery_id = created.json()["id"]
        started = {"api_mib": rss_mib(pid)}
        if milvus is not None:
            started["milvus_mib"] = tree_rss_mib(milvus.pid)
        stored, tic = 0, time.perf_counter()
        for size in sizes:
            for first in range(stored, size, batch):
                upload(client, gallery_id, vectors[first : min(size, first + batch)], first)
            stored = size
            ingest_s = time.perf_counter() - tic
            count = client.get(f"/v1/galleries/{gallery_id}").json()["count"]
            assert count == size, (count, size)
            search_s = searches(client, gallery_id, queries)
            step: dict[str, Any] = {
                "rows": size,
                "api_mib": rss_mib(pid),
                "ingest_s": ingest_s,
                "search_ms": 1000 * search_s,
            }
            if milvus is not None:
                step["milvus_mib"] = tree_rss_mib(milvus.pid)
            steps.append(step)
            print(f"  {size} rows: {step}", flush=True)
            tic = time.perf_counter()
    return {"started": started, "steps": steps, "growth": growth_of(steps)}


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    faiss_growth = result["engines"].get("faiss", {}).get("growth", {}).get("api_mib_per_100k")
    milvus_growth = result["engines"].get("milvus", {}).get("growth", {}).get("api_mib_per_100k")
    if faiss_growth is None or milvus_growth is None:
        return {"met": None}
    limit = TARGET_FRACTION * faiss_growth
    return {
        "met": bool(milvus_growth <= limit),
        "limit_mib_per_100k": limit,
        "milvus_over_faiss": milvus_growth / faiss_growth if faiss_growth else None,
    }


def render_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}` ({result['seconds']:.0f} s). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"One cosine gallery (default flat index) of {result['dim']}-d WordNet MiniLM rows tiled "
        "with noise (real-data-derived), filled through the HTTP API in multipart `.npy` uploads "
        f"of {result['batch']} rows; at each size {SEARCHES} searches of {SEARCH_BATCH} queries "
        f"(k = {K}). RSS = VmRSS of the API process (uvicorn, embedded SQLite, thread runner); the "
        "Milvus server (a milvus-lite gRPC server process, reached at http://127.0.0.1:port) is "
        "measured separately. Growth: least-squares slope of RSS over rows from the second size "
        "on (the first size is the warm-up: imports, first requests, allocator arenas).",
        "",
        "| engine | rows | API RSS MiB | Milvus server RSS MiB | ingest s (this step) "
        "| search ms (16 queries) |",
        "|---|---|---|---|---|---|",
    ]
    for engine, run in result["engines"].items():
        base = run["started"]
        lines.append(
            f"| {engine} | 0 (gallery created) | {base['api_mib']:.0f} "
            f"| {_mib(base.get('milvus_mib'))} | | |"
        )
        for step in run["steps"]:
            lines.append(
                f"| {engine} | {step['rows']:,} | {step['api_mib']:.0f} "
                f"| {_mib(step.get('milvus_mib'))} | {step['ingest_s']:.1f} "
                f"| {step['search_ms']:.1f} |"
            )
    lines += ["", "Growth per 100k rows (MiB):", ""]
    for engine, run in result["engines"].items():
        growth = run["growth"]
        text = f"- {engine}: API process {_plus_minus(growth, 'api')}"
        if "milvus_mib_per_100k" in growth:
            text += f"; Milvus server {_plus_minus(growth, 'milvus')}"
        lines.append(text)
    lines += ["", reading(result)]
    return "\n".join(lines) + "\n"


def reading(result: dict[str, Any]) -> str:
    check = result["verdict"]
    if check["met"] is None:
        return "Reading: one engine only, no comparison."
    faiss = result["engines"]["faiss"]["growth"]["api_mib_per_100k"]
    milvus = result["engines"]["milvus"]["growth"]["api_mib_per_100k"]
    raw = result["dim"] * 4 * 100_000 / 2**20
    head = (
        f"Reading: per 100k rows the API process grows {faiss:.0f} MiB under FAISS (the raw "
        f"float32 vectors are {raw:.0f} MiB per 100k) and {milvus:.1f} MiB under Milvus "
        f"({100 * check['milvus_over_faiss']:.1f} % of FAISS's). Target (the API process's memory "
        f"no longer grows with gallery size under Milvus, read as ≤ {100 * TARGET_FRACTION:.0f} % "
        f"of FAISS's growth, {check['limit_mib_per_100k']:.1f} MiB per 100k): "
    )
    error = result["engines"]["milvus"]["growth"].get("api_error_per_100k")
    if error is not None:
        head = head.replace(
            f"{milvus:.1f} MiB under Milvus", f"{milvus:.1f} ± {error:.1f} MiB under Milvus"
        )
    if check["met"]:
        text = head + "met. The Milvus server's memory carries the gallery instead."
    else:
        over = milvus - check["limit_mib_per_100k"]
        text = head + f"missed by {over:.1f} MiB per 100k rows."
    if error is not None and abs(milvus) <= 2 * error:
        text += (
            " The Milvus slope is within two standard errors of zero: the API's RSS moves between"
            " steps (allocator caches, the last requests' buffers) by more than the gallery adds."
        )
    return text


def _mib(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


def _plus_minus(growth: dict[str, float | None], process: str) -> str:
    slope, error = growth[f"{process}_mib_per_100k"], growth.get(f"{process}_error_per_100k")
    if slope is None:
        return "n/a"
    return f"{slope:+.1f}" + ("" if error is None else f" ± {error:.1f} (standard error)")


def workload(sizes: Sequence[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows up to the largest size (WordNet MiniLM rows tiled with noise) and the searches'
    queries (noisy copies of rows within the first size, there at every step)."""
    base = wordnet_rows(with_new=False).old
    vectors = tiled(base, max(sizes), seed=seed)
    rng = np.random.default_rng(seed + 1)
    picks = rng.integers(0, min(sizes), SEARCHES * SEARCH_BATCH)
    noise = 0.05 * rng.standard_normal((len(picks), base.shape[1]))
    return vectors, (vectors[picks] + noise).astype(np.float32)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--batch", type=int, default=5_000, help="rows per upload request")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--quick", action="store_true", help="1k-4k rows, no BENCHMARKS section")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-markdown", action="store_true")
    parser.add_argument(
        "--render", metavar="JSON", help="recompute growth and republish a saved run's results"
    )
    args = parser.parse_args(argv)
    if args.quick:
        quick_data_dir("bench.perf.api_memory")
    if args.render:
        return republish(Path(args.render), args.no_markdown)
    sizes = sorted(QUICK_SIZES if args.quick else args.sizes)
    if len(sizes) < 3:
        parser.error("--sizes: at least three (the first is the warm-up)")
    batch = min(args.batch, 1_000) if args.quick else args.batch
    load_start = load_average()
    tic = time.perf_counter()
    vectors, queries = workload(sizes, args.seed)
    engines = {}
    for engine in args.engines:
        print(f"{engine}:", flush=True)
        engines[engine] = engine_run(engine, vectors, queries, sizes, batch)
    result = {
        **run_record(command_line("bench.perf.api_memory", argv), tic, load_start),
        "dim": int(vectors.shape[1]),
        "batch": batch,
        "sizes": sizes,
        "target_fraction": TARGET_FRACTION,
        "engines": engines,
    }
    result["verdict"] = verdict(result)
    out = args.out or RESULTS / ("api_memory_quick.json" if args.quick else "api_memory.json")
    section = None if (args.no_markdown or args.quick) else SECTION
    publish(result, Path(out), render_markdown(result), section, TITLE)
    return result


def republish(path: Path, no_markdown: bool) -> dict[str, Any]:
    """Growth, verdict and section again from a saved run's steps (its command line kept)."""
    result = json.loads(path.read_text())
    for run in result["engines"].values():
        run["growth"] = growth_of(run["steps"])
    result["verdict"] = verdict(result)
    publish(result, path, render_markdown(result), None if no_markdown else SECTION, TITLE)
    return result


if __name__ == "__main__":
    main()
