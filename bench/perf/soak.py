"""Soak under hostile load: two tenants upload, search and train upgrades while hostile clients
stall, trickle, oversize and forge their requests, for a fixed time, against a real uvicorn
server on loopback (embedded mode) that the script starts and stops itself.

    python -m bench.perf.soak            # 60 s: bench/results/soak.json and its BENCHMARKS.md section
    python -m bench.perf.soak --quick    # 10 s, nothing published (bench/out/soak_quick.json)

Checks (``bench.perf.soak_checks.evaluate``; exit status 1 when one fails): no 5xx, seen by the
clients or counted by the server's /metrics; every healthy request gets its expected status;
every hostile one answered as it should be (``HOSTILE_EXPECTED``: its 4xx; the streamed big
search 200); every id acknowledged with a 2xx reads back through the API with the vector last sent for it, live and after a restart, and each
gallery's count is the number of acknowledged ids (no refused write was stored); each healthy
kind's p99 latency under ``--p99-bound-ms``; every upgrade ends succeeded or cancelled; the
server's VmRSS (sampled every 0.25 s while the load runs) under its value at the load's start +
``--rss-headroom-mib``; no traceback in the server log.

Issue 45's hostile clients: JSON searches of 1,000 queries × k = 1,000 (over
MAX_HITS_PER_REQUEST: 422), the same search asked for as NDJSON (streamed in chunks: 200 with its
``done`` line, read to the end; a few, one at a time, on the first tenant's gallery), bodies under
a junk key that promise 8 MiB and send 32 KiB (401, or 429 once throttled, from the headers), and
connections that trickle header bytes and never end them (408 after HEADER_TIMEOUT_S, 431, or
closed). The server runs as ``nobackfill serve`` runs it (uvicorn with the bounded-headers
protocol of ``app.api.http_protocol``), not as the plain ``uvicorn`` command.

Rows are the committed 800-synset WordNet-noun fixture's MiniLM rows (gloss and lemma), each
drawn at random plus noise of norm 0.1; the upgrades pair 200 synsets' MiniLM gloss rows with
their mpnet gloss rows (``procrustes``). The hostile clients' connections are raw sockets
(``bench.perf.soak_clients``); the wrong keys come from 127.0.0.3, so the per-address
throttle they trip does not hold back the healthy clients on 127.0.0.1. Client and server share
the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common.machine import load_average, machine_facts
from bench.common.report import command_line, publish
from bench.common.service import (
    BENCH_KEY,
    RunningService,
    npy_bytes,
    start_service,
)
from bench.common.wordnet import NEW_MODEL, OLD_MODEL, REPO_ROOT
from bench.perf.load import noisy_rows
from bench.perf.soak_checks import (
    HEALTHY_EXPECTED,
    HOSTILE_EXPECTED,
    Tally,
    WriteLog,
    evaluate,
    lost_writes,
    render_markdown,
)
from bench.perf.soak_clients import (
    MAX_LOOPS,
    NPY,
    OCTET,
    Target,
    big_search_body,
    big_searches,
    header_slowlorises,
    hostile_content,
    junk_key_bodies,
    oversized_bodies,
    stalled_bodies,
    streamed_searches,
    timed,
    trickled_bodies,
    wrong_keys,
)

SECTION = "bench.perf.soak"
TITLE = "Soak under hostile load (bench.perf.soak)"
FIXTURE = REPO_ROOT / "tests/fixtures/wordnet_small.npz"
MAX_REQUEST_BYTES = 2 * 1024 * 1024
IDLE_TIMEOUT_S, BODY_TIMEOUT_S, HEADER_TIMEOUT_S = 2.0, 6.0, 3.0
# Lowered so that stalled and trickled bodies (and trickled headers) end within the run, and
# oversized ones are cheap;
# the upload caps, auth throttle and job quota keep their defaults (8 and 64 bodies, 20 failures
# in 60 s, 4 active jobs).
SERVER_ENV = {
    "NOBACKFILL_JOB_RUNNER": "thread",
    "NOBACKFILL_BODY_IDLE_TIMEOUT_S": f"{IDLE_TIMEOUT_S:g}",
    "NOBACKFILL_BODY_TIMEOUT_S": f"{BODY_TIMEOUT_S:g}",
    "NOBACKFILL_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
    "NOBACKFILL_HEADER_TIMEOUT_S": f"{HEADER_TIMEOUT_S:g}",
}
# Issue 45's hostile clients. A big search: queries × k over MAX_HITS_PER_REQUEST (200,000).
BIG_ROWS, BIG_K = 1000, 1000
# The same search streamed as NDJSON: a few in the run, one at a time; the server's VmRSS, sampled
# every RSS_INTERVAL_S, must stay under its value at the start of the load + RSS_HEADROOM_MIB.
STREAMED_FIRST_S, STREAMED_INTERVAL_S = 2.0, 15.0
RSS_INTERVAL_S, RSS_HEADROOM_MIB = 0.25, 1024.0
# Junk-key bodies: 8 MiB promised, 32 KiB sent (under uvicorn's 64 KiB read buffer).
JUNK_CLAIMED, JUNK_SENT = 8 * 2**20, 32 * 2**10
SLOWLORIS_INTERVAL_S = 0.5
# The first 60 s run here measured a worst-kind p99 of 1.24 s (upload_json) while other
# engineers' tests shared the 2 cores (load average 2.3 → 5.5): the bound leaves ~2.4× headroom.
P99_BOUND_MS = 3000.0
BOUND_NOTE = (
    "The bound was set after a first 60 s run on this machine measured a worst-kind p99 of "
    "1.24 s (upload_json) with other engineers' tests on the same 2 cores (load average 2.3 at "
    "the start, 5.5 at the end): about 2.4× headroom. `tests/service/test_soak.py` runs "
    "`--quick` and holds it to 5 s (CI machines are slower and busier)."
)
JOB_ITEMS = 200
TERMINAL = ("succeeded", "failed", "cancelled")
HOSTILE_ADDRESS = "127.0.0.3"


@dataclass
class Tenant:
    name: str
    key: str
    gallery: str = ""
    dataset: str = ""
    writes: WriteLog = field(default_factory=WriteLog)


@dataclass
class Soak:
    """What one run records."""

    rows: np.ndarray
    args: argparse.Namespace
    healthy: dict[str, Tally] = field(
        default_factory=lambda: {k: Tally() for k in HEALTHY_EXPECTED}
    )
    hostile: dict[str, Tally] = field(
        default_factory=lambda: {k: Tally() for k in HOSTILE_EXPECTED}
    )
    jobs: Counter[str] = field(default_factory=Counter)
    rss: list[tuple[float, float]] = field(default_factory=list)


def rss_mib(pid: int) -> float | None:
    """The process's VmRSS, MiB (None once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) / 1024 if match else None


async def sample_rss(pid: int, samples: list[tuple[float, float]], until: float) -> None:
    """(seconds into the load, VmRSS MiB) of the server every RSS_INTERVAL_S."""
    tic = time.monotonic()
    for _ in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        mib = rss_mib(pid)
        if mib is not None:
            samples.append((time.monotonic() - tic, mib))
        await asyncio.sleep(RSS_INTERVAL_S)


def fixture_rows() -> dict[str, np.ndarray]:
    data = np.load(FIXTURE)
    return {
        "old": np.concatenate([data[f"{f}.{OLD_MODEL}"] for f in ("gloss", "lemma")]),
        "job_old": data[f"gloss.{OLD_MODEL}"][:JOB_ITEMS],
        "job_new": data[f"gloss.{NEW_MODEL}"][:JOB_ITEMS],
    }


def new_keys(data_dir: Path) -> dict[str, str]:
    """Keys made as ``nobackfill create-key`` makes them: tenant beta's, and mallory's three
    (the upload cap counts per key, so stalled, trickled and other hostile bodies each get one)."""
    import app.db_models  # noqa: F401  (the table registry: Database needs every mapped class)
    from app.auth.service import create_key
    from app.core.db import Database
    from app.core.settings import Settings

    db = Database(Settings(_env_file=None, data_dir=data_dir))
    try:
        with db.session() as session:
            keys = {"beta": create_key(session, "beta", "soak").key}
            for use in ("stall", "trickle", "content"):
                keys[f"mallory-{use}"] = create_key(session, "mallory", use).key
            session.commit()
    finally:
        db.dispose()
    return keys


def _npy_parts(ids: Sequence[str], name: str, rows: np.ndarray) -> dict[str, Any]:
    return {
        "ids": ("ids.npy", npy_bytes(np.array(list(ids))), OCTET),
        name: (f"{name}.npy", npy_bytes(rows), OCTET),
    }


def _post(client: httpx.Client, url: str, **kwargs: Any) -> dict[str, Any]:
    response = client.post(url, **kwargs)
    if not response.is_success:
        raise RuntimeError(f"setup: POST {url} answered {response.status_code}: {response.text}")
    return response.json()


def create_gallery(service: RunningService, tenant: Tenant, name: str, dim: int) -> str:
    headers = {"Authorization": f"Bearer {tenant.key}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as client:
        spec = {"name": name, "dim": dim, "model_name": OLD_MODEL, "metric": "cosine"}
        return str(_post(client, "/v1/galleries", json=spec)["id"])


def set_up_tenant(service: RunningService, tenant: Tenant, soak: Soak, data: dict) -> None:
    """A gallery seeded with ``--seed-rows`` rows (acknowledged writes too), and a dataset of
    new-model features paired with a second gallery, for the upgrades."""
    dim = soak.rows.shape[1]
    tenant.gallery = create_gallery(service, tenant, "soak", dim)
    jobs = create_gallery(service, tenant, "soak-jobs", dim)
    headers = {"Authorization": f"Bearer {tenant.key}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as client:
        rng = np.random.default_rng([soak.args.seed, *tenant.name.encode()])
        ids = [f"{tenant.name}-seed-{i}" for i in range(soak.args.seed_rows)]
        rows = noisy_rows(rng, soak.rows, len(ids))
        url = f"/v1/galleries/{tenant.gallery}/vectors"
        for start in range(0, len(ids), 500):
            part = slice(start, start + 500)
            _post(client, url, files=_npy_parts(ids[part], "vectors", rows[part]))
            tenant.writes.settle(ids[part], rows[part], 200)
        job_ids = [f"syn-{i}" for i in range(JOB_ITEMS)]
        _post(
            client,
            f"/v1/galleries/{jobs}/vectors",
            files=_npy_parts(job_ids, "vectors", data["job_old"]),
        )
        dataset = {"name": "new", "gallery_id": jobs}
        tenant.dataset = _post(client, "/v1/datasets", json=dataset)["id"]
        _post(
            client,
            f"/v1/datasets/{tenant.dataset}/items",
            files=_npy_parts(job_ids, "features", data["job_new"]),
        )


async def uploader(
    client: httpx.AsyncClient, tenant: Tenant, soak: Soak, kind: str, until: float
) -> None:
    """Batches of new ids, and every fourth batch an earlier batch again with new vectors (an
    upsert: the read-back must then find the later vectors)."""
    args, url = soak.args, f"/v1/galleries/{tenant.gallery}/vectors"
    rng = np.random.default_rng([args.seed, *tenant.name.encode(), *kind.encode()])
    sent: list[list[str]] = []
    for n in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        if n % 4 == 3 and sent:
            ids = sent[int(rng.integers(len(sent)))]
        else:
            ids = [f"{tenant.name}-{kind}-{n}-{i}" for i in range(args.batch)]
            sent.append(ids)
        rows = noisy_rows(rng, soak.rows, len(ids))
        request = (
            {"json": {"ids": ids, "vectors": rows.tolist()}}
            if kind == "upload_json"
            else {"files": _npy_parts(ids, "vectors", rows)}
        )
        response = await timed(
            client, soak.healthy[kind], HEALTHY_EXPECTED[kind], "POST", url=url, **request
        )
        tenant.writes.settle(ids, rows, None if response is None else response.status_code)
        await asyncio.sleep(args.pause)


async def searcher(client: httpx.AsyncClient, tenant: Tenant, soak: Soak, until: float) -> None:
    """One JSON query, then eight as one .npy body, in turn (k=10)."""
    args, url = soak.args, f"/v1/galleries/{tenant.gallery}/search"
    rng = np.random.default_rng([args.seed, *tenant.name.encode(), *b"search"])
    for n in range(MAX_LOOPS):
        if time.monotonic() >= until:
            return
        if n % 2 == 0:
            body = {"vectors": noisy_rows(rng, soak.rows, 1).tolist(), "k": 10}
            kind, request = "search_json", {"json": body}
        else:
            content = npy_bytes(noisy_rows(rng, soak.rows, 8))
            kind = "search_npy"
            request = {"content": content, "headers": {"Content-Type": NPY}, "params": {"k": 10}}
        await timed(client, soak.healthy[kind], HEALTHY_EXPECTED[kind], "POST", url=url, **request)
        await asyncio.sleep(args.pause)


async def job_worker(client: httpx.AsyncClient, tenant: Tenant, soak: Soak, until: float) -> None:
    """Procrustes upgrades one after another, polled to the end; every third cancelled at once."""
    grace = until + 60.0
    for n in range(1, MAX_LOOPS):
        if time.monotonic() >= until:
            return
        body = {"dataset_id": tenant.dataset, "method": "procrustes", "seed": n}
        created = await timed(
            client,
            soak.healthy["job_create"],
            HEALTHY_EXPECTED["job_create"],
            "POST",
            url="/v1/upgrades",
            json=body,
        )
        if created is None or created.status_code != 202:
            await asyncio.sleep(1.0)
            continue
        soak.jobs["created"] += 1
        job = created.json()["id"]
        if n % 3 == 0:
            await timed(
                client,
                soak.healthy["job_cancel"],
                HEALTHY_EXPECTED["job_cancel"],
                "POST",
                url=f"/v1/upgrades/{job}/cancel",
            )
        status = "unfinished"
        while time.monotonic() < grace:
            await asyncio.sleep(0.25)
            polled = await timed(
                client,
                soak.healthy["job_poll"],
                HEALTHY_EXPECTED["job_poll"],
                "GET",
                url=f"/v1/upgrades/{job}",
            )
            now = polled.json()["status"] if polled is not None and polled.is_success else None
            if now in TERMINAL:
                status = now
                break
        soak.jobs[status] += 1


async def run_load(
    service: RunningService, tenants: list[Tenant], keys: dict, mallory: str, soak: Soak
) -> float:
    args = soak.args
    host, port = service.url.removeprefix("http://").split(":")
    dim = soak.rows.shape[1]

    def client(key: str, address: str | None = None) -> httpx.AsyncClient:
        transport = httpx.AsyncHTTPTransport(local_address=address) if address else None
        return httpx.AsyncClient(
            base_url=service.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=args.request_timeout,
            limits=httpx.Limits(max_connections=16),
            transport=transport,
        )

    healthy = [client(t.key) for t in tenants]
    streamer = client(tenants[0].key)
    streamer.timeout = httpx.Timeout(120.0)
    content = client(keys["mallory-content"])
    guesser = client("unused", HOSTILE_ADDRESS)
    guesser.headers.pop("Authorization")
    tic = time.monotonic()
    until = tic + args.duration
    tasks = []
    for http, tenant in zip(healthy, tenants, strict=True):
        tasks += [
            uploader(http, tenant, soak, "upload_json", until),
            uploader(http, tenant, soak, "upload_npy", until),
            searcher(http, tenant, soak, until),
            searcher(http, tenant, soak, until),
            job_worker(http, tenant, soak, until),
        ]
    stall = Target(host, int(port), mallory, keys["mallory-stall"], dim)
    trickle = Target(host, int(port), mallory, keys["mallory-trickle"], dim)
    oversize = Target(host, int(port), mallory, keys["mallory-content"], dim)
    evil_alpha = Target(host, int(port), tenants[0].gallery, tenants[0].key, dim)
    junk = Target(host, int(port), tenants[0].gallery, "", dim, HOSTILE_ADDRESS)
    big_body = big_search_body(BIG_ROWS, dim, BIG_K)
    tasks += [
        stalled_bodies(stall, soak.hostile["stalled_body"], until, IDLE_TIMEOUT_S + 15, MAX_LOOPS)
        for _ in range(args.stallers)
    ]
    tasks += [
        trickled_bodies(
            trickle, soak.hostile["trickle_body"], until, 0.5, BODY_TIMEOUT_S, BODY_TIMEOUT_S + 15
        )
        for _ in range(args.tricklers)
    ]
    tasks += [
        oversized_bodies(oversize, soak.hostile, MAX_REQUEST_BYTES, until, 0.5, 30.0),
        hostile_content(
            [(content, oversize), (healthy[0], evil_alpha)], soak.hostile, until, args.hostile_pause
        ),
        wrong_keys(
            guesser, tenants[0].gallery, soak.hostile["wrong_key"], until, args.hostile_pause
        ),
        big_searches(
            content,
            f"/v1/galleries/{mallory}/search",
            big_body,
            soak.hostile["big_search"],
            until,
            args.big_search_pause,
        ),
        streamed_searches(
            streamer,
            f"/v1/galleries/{tenants[0].gallery}/search",
            big_body,
            BIG_ROWS,
            soak.hostile["big_search_streamed"],
            until,
            args.streamed_first_s,
            STREAMED_INTERVAL_S,
        ),
        junk_key_bodies(
            junk, soak.hostile["junk_key_body"], JUNK_CLAIMED, JUNK_SENT, until, 0.2, 15.0
        ),
    ]
    tasks += [
        header_slowlorises(
            junk,
            soak.hostile["header_slowloris"],
            until,
            SLOWLORIS_INTERVAL_S,
            HEADER_TIMEOUT_S,
            HEADER_TIMEOUT_S + 15,
        )
        for _ in range(args.slowlorises)
    ]
    # Sampled until the last request ends (a streamed search may outlast the load's deadline).
    sampler = asyncio.create_task(sample_rss(service.process.pid, soak.rss, until + 600))
    try:
        await asyncio.gather(*tasks)
    finally:
        sampler.cancel()
        for http in [*healthy, streamer, content, guesser]:
            await http.aclose()
    return time.monotonic() - tic


def read_back(client: httpx.Client, gallery: str, ids: Sequence[str], chunk: int = 200) -> dict:
    """The stored vector of every id the gallery holds, read through the API (.npy answers);
    a chunk answering 404 (some id missing) is read again id by id."""
    stored: dict[str, np.ndarray] = {}
    url = f"/v1/galleries/{gallery}/vectors"
    pending = [list(ids[start : start + chunk]) for start in range(0, len(ids), chunk)]
    while pending:
        asked = pending.pop()
        response = client.get(url, params={"ids": asked}, headers={"Accept": NPY})
        if response.status_code == 404 and len(asked) > 1:
            pending += [[item] for item in asked]
            continue
        if response.status_code == 404:
            continue
        response.raise_for_status()
        rows = np.load(io.BytesIO(response.content), allow_pickle=False)
        stored.update(zip(asked, rows, strict=True))
    return stored


def check_writes(service: RunningService, tenants: list[Tenant]) -> tuple[list[str], dict]:
    """Lost acknowledged writes of every tenant (read back now), and each gallery's count."""
    lost, galleries = [], {}
    for tenant in tenants:
        headers = {"Authorization": f"Bearer {tenant.key}"}
        with httpx.Client(base_url=service.url, headers=headers, timeout=120) as client:
            stored = read_back(client, tenant.gallery, list(tenant.writes.acked))
            lost += lost_writes(tenant.writes.acked, stored, tenant.writes.unsettled)
            count = client.get(f"/v1/galleries/{tenant.gallery}").json()["count"]
        galleries[tenant.name] = {"count": count, "acked_ids": len(tenant.writes.acked)}
    return lost, galleries


def server_5xx(service: RunningService) -> int:
    text = httpx.get(f"{service.url}/metrics", timeout=30).text
    pattern = re.compile(r'^nobackfill_http_requests_total\{.*status="(\d+)".*\} (\S+)$', re.M)
    return int(sum(float(n) for status, n in pattern.findall(text) if int(status) >= 500))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s, not published")
    parser.add_argument("--duration", type=float, default=None, help="seconds of load")
    parser.add_argument("--batch", type=int, default=32, help="rows per healthy upload")
    parser.add_argument("--seed-rows", type=int, default=None, help="rows per gallery at start")
    parser.add_argument("--pause", type=float, default=0.02, help="healthy think time, s")
    parser.add_argument("--hostile-pause", type=float, default=0.05, help="s between hostile")
    parser.add_argument("--stallers", type=int, default=10, help="stalled bodies held open")
    parser.add_argument("--tricklers", type=int, default=3, help="trickled bodies held open")
    parser.add_argument("--slowlorises", type=int, default=4, help="trickled headers held open")
    parser.add_argument(
        "--big-search-pause", type=float, default=1.0, help="s between big (422) searches"
    )
    parser.add_argument(
        "--streamed-first-s",
        type=float,
        default=STREAMED_FIRST_S,
        help="s into the load of the first streamed big search (past --duration: none)",
    )
    parser.add_argument(
        "--rss-headroom-mib",
        type=float,
        default=RSS_HEADROOM_MIB,
        help="server VmRSS bound: its value at the load's start + this",
    )
    parser.add_argument("--p99-bound-ms", type=float, default=P99_BOUND_MS)
    parser.add_argument("--request-timeout", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args(argv)
    args.duration = args.duration or (10.0 if args.quick else 60.0)
    if args.seed_rows is None:
        args.seed_rows = 500 if args.quick else 2000
    data = fixture_rows()
    soak = Soak(data["old"], args)
    workdir = Path(tempfile.mkdtemp(prefix="nobackfill-bench-soak-"))
    data_dir = workdir / "data"
    service = start_service(data_dir, SERVER_ENV, startup_timeout=120.0, cli_serve=True)
    try:
        keys = new_keys(data_dir)
        tenants = [Tenant("alpha", BENCH_KEY), Tenant("beta", keys["beta"])]
        for tenant in tenants:
            set_up_tenant(service, tenant, soak, data)
        mallory = Tenant("mallory", keys["mallory-content"])
        mallory.gallery = create_gallery(service, mallory, "mallory", soak.rows.shape[1])
        load_start = load_average()
        rss_start = rss_mib(service.process.pid) or 0.0
        seconds = asyncio.run(run_load(service, tenants, keys, mallory.gallery, soak))
        load_end = load_average()
        alive = service.process.poll() is None
        fives = server_5xx(service)
        lost_live, galleries = check_writes(service, [*tenants, mallory])
        service.stop()
        service = start_service(data_dir, SERVER_ENV, startup_timeout=120.0, cli_serve=True)
        lost_restart, _ = check_writes(service, tenants)
    finally:
        service.stop()
        log = service.log_path.read_text(errors="replace") if service.log_path.exists() else ""
        shutil.rmtree(workdir, ignore_errors=True)
    run = {
        "healthy": {k: t.summary(HEALTHY_EXPECTED[k]) for k, t in soak.healthy.items()},
        "hostile": {k: t.summary(HOSTILE_EXPECTED[k]) for k, t in soak.hostile.items()},
        "writes": {
            "acked_requests": sum(t.writes.acked_requests for t in tenants),
            "acked_ids": sum(len(t.writes.acked) for t in tenants),
            "lost_live": lost_live[:50],
            "lost_after_restart": lost_restart[:50],
            "galleries": galleries,
        },
        "jobs": {s: soak.jobs[s] for s in ("created", *TERMINAL, "unfinished")},
        "server": {
            "responses_5xx": fives,
            "tracebacks": log.count("Traceback"),
            "alive": alive,
            "log_tail": log[-3000:] if "Traceback" in log else "",
            "rss": {
                "start_mib": rss_start,
                "peak_mib": max((mib for _, mib in soak.rss), default=0.0),
                "bound_mib": rss_start + args.rss_headroom_mib,
                "samples": len(soak.rss),
                "interval_s": RSS_INTERVAL_S,
                "timeline": [[round(t, 2), round(mib, 1)] for t, mib in soak.rss[::4]],
            },
        },
    }
    checks = evaluate(run, args.p99_bound_ms)
    result = {
        "command": command_line("bench.perf.soak", argv),
        "machine": machine_facts(),
        "load_start": load_start,
        "load_end": load_end,
        "seconds": seconds,
        "server_env": SERVER_ENV,
        "setup": {
            **{k: vars(args)[k] for k in ("duration", "batch", "pause", "seed_rows")},
            **{k: vars(args)[k] for k in ("stallers", "tricklers", "slowlorises")},
            "big_rows": BIG_ROWS,
            "big_k": BIG_K,
            "big_search_pause": args.big_search_pause,
            "streamed": soak.hostile["big_search_streamed"].statuses.total(),
            "streamed_interval_s": STREAMED_INTERVAL_S,
            "junk_claimed_bytes": JUNK_CLAIMED,
            "junk_sent_bytes": JUNK_SENT,
            "slowloris_interval_s": SLOWLORIS_INTERVAL_S,
            "dim": int(soak.rows.shape[1]),
            "job_items": JOB_ITEMS,
            "hostile_address": HOSTILE_ADDRESS,
        },
        "p99_bound_ms": args.p99_bound_ms,
        "p99_bound_note": BOUND_NOTE if args.p99_bound_ms == P99_BOUND_MS else "",
        **run,
        "checks": checks,
        "ok": all(c["ok"] for c in checks.values()),
    }
    for name, c in checks.items():
        print(f"{name}: {'ok' if c['ok'] else 'FAILED'} — {c['detail']}")
    out = args.out or (
        REPO_ROOT / ("bench/out/soak_quick.json" if args.quick else "bench/results/soak.json")
    )
    section = None if args.no_markdown or args.quick else SECTION
    publish(result, Path(out), render_markdown(result), section, TITLE)
    return result


if __name__ == "__main__":
    raise SystemExit(0 if main()["ok"] else 1)
