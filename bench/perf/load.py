"""Load: concurrent searching clients while one client ingests, for a fixed time, against a real
uvicorn server on loopback (embedded mode: SQLite, index files flushed in the background).

    python -m bench.perf.load               # 8 searchers + 1 ingester for 45 s on a 20k-row gallery:
                                       # bench/results/load.json and the bench.perf.load section
    python -m bench.perf.load --quick       # 4 searchers for 5 s on 2k rows, results not published

Rows are real-data-derived: the WordNet-noun MiniLM rows (gloss and lemma texts; the committed
800-synset test fixture when the shared data is absent), drawn at random, each draw plus Gaussian
noise of norm 0.1 (``bench.common.tiled``'s recipe), in a cosine gallery. The figures measure the service
under concurrency, not search quality. Each searcher sends one JSON request of ``--queries``
rows at a time and waits for the answer (closed loop); the ingester uploads batches of
``--batch`` new rows back to back. Every non-2xx answer and every transport error counts as an
error. Client and server share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.core.settings import Settings
from bench.common.machine import facts_markdown, load_average, machine_facts
from bench.common.report import command_line, publish
from bench.common.service import BENCH_KEY, create_gallery, start_service
from bench.common.tiled import DEFAULT_NOISE
from bench.common.wordnet import FIELDS, OLD_MODEL, REPO_ROOT, load_wordnet, quick_data_dir

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.load"
TITLE = "Load (bench.perf.load)"
FIXTURE = REPO_ROOT / "tests/fixtures/wordnet_small.npz"
# Characters of the server's log a run with errors keeps in its result.
SERVER_LOG_TAIL = 4000
DEFAULT_PER_KEY_CAP = Settings.model_fields["max_concurrent_uploads_per_key"].default


class Recorder:
    """Latencies and errors of one kind of request."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.rows = 0

    def summary(self, seconds: float) -> dict[str, Any]:
        ms = np.asarray(self.latencies) * 1e3
        return {
            "requests": len(self.latencies),
            "requests_per_s": len(self.latencies) / seconds,
            "rows": self.rows,
            "rows_per_s": self.rows / seconds,
            "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
            "errors": len(self.errors),
            "first_errors": self.errors[:5],
        }


def real_rows() -> tuple[np.ndarray, str]:
    """The real MiniLM rows the load draws from, and where they came from."""
    try:
        data = load_wordnet(fields=FIELDS, models=(OLD_MODEL,))
    except FileNotFoundError:
        fixture = np.load(FIXTURE)
        rows = np.concatenate([fixture[f"{f}.{OLD_MODEL}"] for f in FIELDS])
        return rows.astype(np.float32), f"the test fixture's {len(rows):,} WordNet-noun MiniLM rows"
    rows = np.concatenate([data.get(f, OLD_MODEL) for f in FIELDS])
    return rows, f"the {len(rows):,} WordNet-noun MiniLM rows"


def noisy_rows(rng: np.random.Generator, base: np.ndarray, n: int) -> np.ndarray:
    """``n`` rows drawn from ``base``, each plus noise of norm ≈ ``DEFAULT_NOISE``."""
    picked = base[rng.integers(0, len(base), size=n)]
    jitter = rng.standard_normal(picked.shape, dtype=np.float32)
    return picked + (DEFAULT_NOISE / np.sqrt(base.shape[1])) * jitter


async def timed_post(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], record: Recorder, rows: int
) -> None:
    tic = time.perf_counter()
    try:
        response = await client.post(url, json=body)
    except httpx.HTTPError as exc:
        record.errors.append(f"{type(exc).__name__}: {exc}")
        return
    record.latencies.append(time.perf_counter() - tic)
    if response.is_success:
        record.rows += rows
    else:
        record.errors.append(f"{response.status_code}: {response.text[:200]}")


async def searcher(
    client: httpx.AsyncClient, url: str, queries: np.ndarray, args, until: float, record: Recorder
) -> None:
    rng = np.random.default_rng()
    while time.monotonic() < until:
        picked = queries[rng.integers(0, len(queries), size=args.queries)]
        body = {"vectors": picked.tolist(), "k": args.k}
        await timed_post(client, url, body, record, args.queries)


async def ingester(
    client: httpx.AsyncClient, url: str, base: np.ndarray, args, until: float, record: Recorder
) -> None:
    rng = np.random.default_rng(args.seed + 1)
    batch_no = 0
    while time.monotonic() < until:
        ids = [f"load-{batch_no}-{i}" for i in range(args.batch)]
        body = {"ids": ids, "vectors": noisy_rows(rng, base, args.batch).tolist()}
        await timed_post(client, url, body, record, args.batch)
        batch_no += 1


async def run_load(
    base_url: str, gallery_id: str, base: np.ndarray, args
) -> tuple[dict[str, Recorder], float]:
    rng = np.random.default_rng(args.seed)
    queries = noisy_rows(rng, base, 1000)
    records = {"search": Recorder(), "ingest": Recorder()}
    headers = {"Authorization": f"Bearer {BENCH_KEY}"}
    limits = httpx.Limits(max_connections=args.clients + 2)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=120, limits=limits
    ) as client:
        tic = time.monotonic()
        until = tic + args.duration
        search_url = f"/v1/galleries/{gallery_id}/search"
        tasks = [
            searcher(client, search_url, queries, args, until, records["search"])
            for _ in range(args.clients)
        ]
        tasks.append(
            ingester(
                client, f"/v1/galleries/{gallery_id}/vectors", base, args, until, records["ingest"]
            )
        )
        await asyncio.gather(*tasks)
        return records, time.monotonic() - tic


def seed_gallery(base_url: str, gallery_id: str, base: np.ndarray, args) -> None:
    rng = np.random.default_rng(args.seed)
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {BENCH_KEY}"}, timeout=600
    ) as client:
        for start in range(0, args.rows, 5000):
            n = min(5000, args.rows - start)
            body = {
                "ids": [f"seed-{start + i}" for i in range(n)],
                "vectors": noisy_rows(rng, base, n).tolist(),
            }
            client.post(f"/v1/galleries/{gallery_id}/vectors", json=body).raise_for_status()


def render_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}`. "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"{result['clients']} searching clients (closed loop, {result['queries']} queries of "
        f"k={result['k']} per request) and 1 client uploading batches of {result['batch']} rows, "
        f"together for {result['seconds']:.1f} s, against a real uvicorn server on loopback "
        f"(embedded mode) holding a cosine gallery of {result['rows']:,} {result['dim']}-d rows at the "
        f"start and {result['final_count']:,} at the end; rows and queries are {result['source']} "
        "drawn at random, each plus noise of norm 0.1 (real-data-derived). Client and server "
        "shared the machine's cores. All clients send one API key"
        + (
            f", its cap on requests with a body in progress raised to {result['per_key_cap']}."
            if result.get("per_key_cap", DEFAULT_PER_KEY_CAP) != DEFAULT_PER_KEY_CAP
            else "."
        ),
        "",
        "| requests | count | requests/s | rows/s | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in result["results"].items():
        p50 = "–" if s["p50_ms"] is None else f"{s['p50_ms']:.1f}"
        p99 = "–" if s["p99_ms"] is None else f"{s['p99_ms']:.1f}"
        lines.append(
            f"| {name} | {s['requests']:,} | {s['requests_per_s']:.1f} | {s['rows_per_s']:,.0f} "
            f"| {p50} | {p99} | {s['errors']} |"
        )
    total = sum(s["errors"] for s in result["results"].values())
    lines += ["", f"Target (issue 5): 0 errors — {'met' if total == 0 else 'missed'} ({total})."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 searchers, 5 s, 2k rows")
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--duration", type=float, default=None, help="seconds of load")
    parser.add_argument("--rows", type=int, default=None, help="gallery rows before the load")
    parser.add_argument("--queries", type=int, default=1, help="query rows per search request")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--batch", type=int, default=500, help="rows per upload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        quick_data_dir("bench.perf.load")
    args.clients = args.clients or (4 if args.quick else 8)
    args.duration = args.duration or (5.0 if args.quick else 45.0)
    args.rows = args.rows if args.rows is not None else (2000 if args.quick else 20_000)

    base, source = real_rows()
    args.dim = base.shape[1]
    workdir = Path(tempfile.mkdtemp(prefix="nobackfill-bench-load-"))
    # One API key drives every client: its cap on bodies in progress fits them all (the cap is
    # measured by tests/service/test_stalled_clients.py, not here).
    args.per_key_cap = max(DEFAULT_PER_KEY_CAP, args.clients + 1)
    env = {"NOBACKFILL_MAX_CONCURRENT_UPLOADS_PER_KEY": str(args.per_key_cap)}
    service = start_service(workdir / "data", env, startup_timeout=120)
    try:
        gallery_id = create_gallery(
            service,
            {"name": "load", "dim": args.dim, "model_name": OLD_MODEL, "metric": "cosine"},
        )
        seed_gallery(service.url, gallery_id, base, args)
        load_start = load_average()
        records, seconds = asyncio.run(run_load(service.url, gallery_id, base, args))
        load_end = load_average()
        with service.client() as client:
            final_count = client.get(f"/v1/galleries/{gallery_id}").json()["count"]
    finally:
        service.stop()
        # An error's cause is in the server's log, which goes with the data directory.
        server_log = service.log_path.read_text(errors="replace")
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "command": command_line("bench.perf.load", argv),
        "machine": machine_facts(),
        "load_start": load_start,
        "load_end": load_end,
        "seconds": seconds,
        "clients": args.clients,
        "per_key_cap": args.per_key_cap,
        "queries": args.queries,
        "k": args.k,
        "batch": args.batch,
        "rows": args.rows,
        "dim": args.dim,
        "source": source,
        "final_count": final_count,
        "results": {name: r.summary(seconds) for name, r in records.items()},
    }
    if any(r.errors for r in records.values()):
        result["server_log_tail"] = server_log[-SERVER_LOG_TAIL:]
    for name, s in result["results"].items():
        print(
            f"{name}: {s['requests']} requests, {s['requests_per_s']:.1f}/s, "
            f"p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, {s['errors']} errors"
        )
    out = args.out or RESULTS / ("load_quick.json" if args.quick else "load.json")
    section = None if args.no_markdown or args.quick else SECTION
    publish(result, Path(out), render_markdown(result), section, TITLE)
    return result


if __name__ == "__main__":
    main()
