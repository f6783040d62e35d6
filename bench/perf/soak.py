"""Soak under hostile load: two tenants upload, search and train upgrades while hostile clients
stall, trickle, oversize and forge their requests, flood the job queue and (in a second phase)
wedge the database, for a fixed time, against a real uvicorn server on loopback that the script
starts and stops itself.

    python -m bench.perf.soak            # both phases: bench/results/soak.json and its section
    python -m bench.perf.soak --quick    # short phases, nothing published (bench/out/soak_quick.json)

Two phases, one after the other, each with a server of its own and the same clients:
``embedded`` (SQLite, as the service runs by default) and ``postgresql`` (a fresh database on the
local server, dropped after, reached through a TCP proxy, ``bench.common.fault_proxy``, that is
frozen ``--wedges`` times for ``--wedge-s`` seconds while the load runs: connections stay open,
nothing answers). ``--phases`` picks one.

Checks per phase (``bench.perf.soak_checks.evaluate``; exit status 1 when one fails): no 5xx,
seen by the clients or counted by the server's /metrics, other than a 503 with Retry-After
answered inside a wedge window or within its grace (the longest the configured database
timeouts let a request wait: the pool's wait, then a ping and a reconnect or one read); every
healthy request gets its expected status (or such a 503); every hostile one answered as it
should be (``HOSTILE_EXPECTED``: its 4xx; the streamed big search 200; the flood 202 until its
cap, then 429); every id acknowledged with a 2xx reads back through the API with the vector last
sent for it (or one sent after it without a clear answer), live and after a restart, and each
gallery's count is the number of those ids (no refused write was stored); each healthy kind's
p99 latency, outside the wedge windows, under ``--p99-bound-ms``; every healthy upgrade that
started did so within ``--job-start-bound-s`` of its creation while the flood's tenant held its
slot, and every one ends succeeded or cancelled; the flood's tenant was refused (429) and ran a
job at the end, and its jobs, cancelled then, all end cancelled; after each wedge uploads and
searches succeed again; the server's VmRSS (sampled every 0.25 s while the load runs) under its
value at the load's start + ``--rss-headroom-mib``; no traceback in the server log.

Issue 45's hostile clients: JSON searches of 1,000 queries × k = 1,000 (over
MAX_HITS_PER_REQUEST: 422), the same search asked for as NDJSON (streamed in chunks: 200 with its
``done`` line, read to the end; a few, one at a time, on the first tenant's gallery), bodies under
a junk key that promise 8 MiB and send 32 KiB (401, or 429 once throttled, from the headers),
connections that trickle header bytes and never end them (408 after HEADER_TIMEOUT_S, 431, or
closed), a tenant that keeps the job queue full of the longest upgrades the server accepts (every
parameter the server caps at the maximum its ``/v1/upgrades/methods`` advertises), and the wedged
database. The server runs as ``nobackfill serve`` runs it (uvicorn with the bounded-headers
protocol of ``app.api.http_protocol``), not as the plain ``uvicorn`` command, with two job slots
(``NOBACKFILL_JOB_THREADS=2``: with one, a running job of the flood holds the only slot and no
fairness can start another tenant's job before it ends).

Rows are the committed 800-synset WordNet-noun fixture's MiniLM rows (gloss and lemma), each
drawn at random plus noise of norm 0.1; the upgrades pair 200 synsets' MiniLM gloss rows with
their mpnet gloss rows (``procrustes`` for the healthy tenants). The hostile clients' connections
are raw sockets (``bench.perf.soak_clients``); the wrong keys come from 127.0.0.3, so the
per-address throttle they trip does not hold back the healthy clients on 127.0.0.1. Client and
server share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common.fault_proxy import FreezableProxy
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
    Window,
    WriteLog,
    evaluate,
    job_waits,
    log_tracebacks,
    lost_writes,
    recoveries,
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
    job_flood,
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
PHASES = ("embedded", "postgresql")
POSTGRES = os.environ.get(
    "NOBACKFILL_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MAX_REQUEST_BYTES = 2 * 1024 * 1024
IDLE_TIMEOUT_S, BODY_TIMEOUT_S, HEADER_TIMEOUT_S = 2.0, 6.0, 3.0
# Lowered so that stalled and trickled bodies (and trickled headers) end within the run, and
# oversized ones are cheap; two job slots, so that the flood's running job cannot hold the only
# one (the per-tenant cap of one running job leaves the other to everyone else). The upload caps,
# auth throttle and job quotas keep their defaults (8 and 64 bodies, 20 failures in 60 s, 4
# active jobs and 4,000,000 estimated steps per tenant, one running).
SERVER_ENV = {
    "NOBACKFILL_JOB_RUNNER": "thread",
    "NOBACKFILL_JOB_THREADS": "2",
    "NOBACKFILL_BODY_IDLE_TIMEOUT_S": f"{IDLE_TIMEOUT_S:g}",
    "NOBACKFILL_BODY_TIMEOUT_S": f"{BODY_TIMEOUT_S:g}",
    "NOBACKFILL_MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
    "NOBACKFILL_HEADER_TIMEOUT_S": f"{HEADER_TIMEOUT_S:g}",
}
# The PostgreSQL phase's database timeouts, lowered from their defaults (a pool wait of 5 s, a
# ping of 2 s, a connect of 5 s, a read of 130 s above a 120 s statement_timeout) so that a wedge
# of a few seconds outlasts each of them: every wait on the wedged server ends in a 503.
POOL_TIMEOUT_S, PING_TIMEOUT_S, CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 2.0, 1.0, 2, 3.0
PG_ENV = {
    "NOBACKFILL_DB_POOL_TIMEOUT_S": f"{POOL_TIMEOUT_S:g}",
    "NOBACKFILL_DB_PING_TIMEOUT_S": f"{PING_TIMEOUT_S:g}",
    "NOBACKFILL_DB_CONNECT_TIMEOUT_S": str(CONNECT_TIMEOUT_S),
    "NOBACKFILL_DB_READ_TIMEOUT_S": f"{READ_TIMEOUT_S:g}",
    "NOBACKFILL_PG_STATEMENT_TIMEOUT_MS": str(int(READ_TIMEOUT_S * 1000) - 500),
    # A claim whose commit times out in a wedge may still reach the server when it thaws (the
    # proxy forwards what it held): the job reads "running" with no slot running it until its
    # heartbeat looks stale and the sweeper hands it to a slot again (or cancels it, if asked).
    # Shortened from 10 / 120 / 30 s so that this happens within the phase; the stale time stays
    # above a wedge plus a read timeout plus a heartbeat, so a live job never looks stale.
    "NOBACKFILL_JOB_HEARTBEAT_S": "2",
    "NOBACKFILL_JOB_STALE_AFTER_S": "15",
    "NOBACKFILL_JOB_SWEEP_INTERVAL_S": "5",
}
# The longest a request may wait on a wedged database before its 503: a wait for a pooled
# connection, then either its ping and a reconnect, or one read.
WEDGE_GRACE_S = POOL_TIMEOUT_S + max(PING_TIMEOUT_S + CONNECT_TIMEOUT_S, READ_TIMEOUT_S)
# A wedge's 503 must come at most WEDGE_GRACE_S + WEDGE_SLACK_S after its request was sent: the
# slack is the client's own queueing (its event loop shares 2 cores with the server; healthy
# p99s outside the wedges are about a second here).
WEDGE_SLACK_S = 2.0
WEDGE_S = 5.0
# After the last wedge (and its grace) the load runs at least this long: recovery is measured.
RECOVERY_S = 4.0
# Issue 45's hostile clients. A big search: queries × k over MAX_HITS_PER_REQUEST (200,000).
BIG_ROWS, BIG_K = 1000, 1000
# The same search streamed as NDJSON: a few in the run, one at a time; the server's VmRSS, sampled
# every RSS_INTERVAL_S, must stay under its value at the start of the load + RSS_HEADROOM_MIB.
# 1 GiB was the bound before the flood, after a run at load average ~1 peaked at start + 0.9 GiB;
# rerun on this machine under other engineers' tests (load average ~20) the very same soak
# (commit 31d9007, and this tree's without the flood) peaked at start + 1.3–1.4 GiB: more
# requests in flight at once, slower streams. The flood's training runs in the server's process
# (the thread runner) and held 0.3–0.35 GB there alone (`hidden_dim` 8192). Hence 2 GiB: still
# far below what one unbounded big search took (issue 45: 1.0 → 8.9 GB).
STREAMED_FIRST_S, STREAMED_INTERVAL_S = 2.0, 15.0
RSS_INTERVAL_S, RSS_HEADROOM_MIB = 0.25, 2048.0
# Junk-key bodies: 8 MiB promised, 32 KiB sent (under uvicorn's 64 KiB read buffer).
JUNK_CLAIMED, JUNK_SENT = 8 * 2**20, 32 * 2**10
SLOWLORIS_INTERVAL_S = 0.5
# The flood: upgrades of this method with every parameter the server caps at its maximum; a
# refused one is tried again after FLOOD_RETRY_S. Its jobs are cancelled when the load ends.
FLOOD_METHOD, FLOOD_CAPPED = "l2", ("epochs", "min_batches_per_epoch", "hidden_dim")
FLOOD_RETRY_S = 1.0
# The first 60 s run here measured a worst-kind p99 of 1.24 s (upload_json) while other
# engineers' tests shared the 2 cores (load average 2.3 → 5.5): the bound leaves ~2.4× headroom.
P99_BOUND_MS = 3000.0
BOUND_NOTE = (
    "The p99 bound was set after a first 60 s run on this machine measured a worst-kind p99 of "
    "1.24 s (upload_json) with other engineers' tests on the same 2 cores (load average 2.3 at "
    "the start, 5.5 at the end): about 2.4× headroom. `tests/service/test_soak.py` runs "
    "`--quick` and holds it to 5 s (CI machines are slower and busier)."
)
# From a healthy upgrade's creation to its start (the server's timestamps), outside the wedges.
# Set after the first run (under a provisional 30 s) measured a longest wait of about 4 s (the
# two healthy tenants share the slot the flood leaves, and a procrustes job takes seconds on
# the loaded cores): 2.5× headroom. That run's figures are kept in the results file
# (``job_start_first_run``, carried from one run's results to the next; delete it to record a
# new one) and rendered from there.
JOB_START_BOUND_S = 10.0
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
    """What one phase records. Times are ``time.monotonic()``; ``wall0`` / ``mono0`` pair the
    wall clock (the server's job timestamps) with it at the load's start."""

    rows: np.ndarray
    args: argparse.Namespace
    healthy: dict[str, Tally] = field(
        default_factory=lambda: {k: Tally() for k in HEALTHY_EXPECTED}
    )
    hostile: dict[str, Tally] = field(
        default_factory=lambda: {k: Tally() for k in HOSTILE_EXPECTED}
    )
    jobs: Counter[str] = field(default_factory=Counter)
    job_times: list[tuple[float, float | None, str]] = field(default_factory=list)
    flood_jobs: list[str] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)
    wall0: float = 0.0
    mono0: float = 0.0

    def wall(self, moment: float) -> float:
        """A monotonic moment of this process on the wall clock (the server log's)."""
        return moment - self.mono0 + self.wall0

    def mono(self, stamp: str | None) -> float | None:
        """A server timestamp (ISO 8601) on the monotonic clock of this process."""
        if stamp is None:
            return None
        return datetime.fromisoformat(stamp).timestamp() - self.wall0 + self.mono0


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


def new_keys(data_dir: Path, database_url: str | None) -> dict[str, str]:
    """Keys made as ``nobackfill create-key`` makes them: tenant beta's, and mallory's four
    (the upload cap counts per key, so stalled, trickled and other hostile bodies each get one;
    the flood of jobs has its own)."""
    import app.db_models  # noqa: F401  (the table registry: Database needs every mapped class)
    from app.auth.service import create_key
    from app.core.db import Database
    from app.core.settings import Settings

    db = Database(Settings(_env_file=None, data_dir=data_dir, database_url=database_url))
    try:
        with db.session() as session:
            keys = {"beta": create_key(session, "beta", "soak").key}
            for use in ("stall", "trickle", "content", "flood"):
                keys[f"mallory-{use}"] = create_key(session, "mallory", use).key
            session.commit()
    finally:
        db.dispose()
    return keys


@contextmanager
def phase_database(phase: str) -> Iterator[str | None]:
    """The URL of a fresh PostgreSQL database for the ``postgresql`` phase, dropped after (None:
    SQLite in the server's data directory)."""
    if phase == "embedded":
        yield None
        return
    import psycopg

    admin = POSTGRES.replace("postgresql+psycopg://", "postgresql://")
    name = f"bench_soak_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield POSTGRES.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_address(url: str) -> tuple[str, int]:
    """(host, port) of a SQLAlchemy PostgreSQL URL."""
    host, _, port = url.split("@", 1)[1].split("/", 1)[0].rpartition(":")
    return host, int(port)


def through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's (127.0.0.1:``port``)."""
    head, rest = url.split("@", 1)
    return f"{head}@127.0.0.1:{port}/{rest.split('/', 1)[1]}"


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


def create_job_dataset(service: RunningService, tenant: Tenant, data: dict, dim: int) -> str:
    """A gallery of the 200 synsets' old rows and a dataset of their new rows, paired: what
    the tenant's upgrades train on."""
    jobs = create_gallery(service, tenant, "soak-jobs", dim)
    headers = {"Authorization": f"Bearer {tenant.key}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as client:
        job_ids = [f"syn-{i}" for i in range(JOB_ITEMS)]
        _post(
            client,
            f"/v1/galleries/{jobs}/vectors",
            files=_npy_parts(job_ids, "vectors", data["job_old"]),
        )
        dataset = str(_post(client, "/v1/datasets", json={"name": "new", "gallery_id": jobs})["id"])
        _post(
            client,
            f"/v1/datasets/{dataset}/items",
            files=_npy_parts(job_ids, "features", data["job_new"]),
        )
    return dataset


def set_up_tenant(service: RunningService, tenant: Tenant, soak: Soak, data: dict) -> None:
    """A gallery seeded with ``--seed-rows`` rows (acknowledged writes too), and a dataset of
    new-model features paired with a second gallery, for the upgrades."""
    dim = soak.rows.shape[1]
    tenant.gallery = create_gallery(service, tenant, "soak", dim)
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
    tenant.dataset = create_job_dataset(service, tenant, data, dim)


def flood_body(service: RunningService, key: str, dataset: str) -> dict[str, Any]:
    """The flood's upgrade: ``FLOOD_METHOD`` with each of ``FLOOD_CAPPED`` at the maximum the
    server's method catalogue advertises (exactly what it accepts)."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as client:
        response = client.get("/v1/upgrades/methods")
        response.raise_for_status()
    (method,) = [m for m in response.json()["methods"] if m["name"] == FLOOD_METHOD]
    params = {p["name"]: p["maximum"] for p in method["params"] if p["name"] in FLOOD_CAPPED}
    if set(params) != set(FLOOD_CAPPED):
        raise RuntimeError(f"the catalogue caps {sorted(params)}, expected {FLOOD_CAPPED}")
    return {"dataset_id": dataset, "method": FLOOD_METHOD, "params": params}


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
    """Procrustes upgrades one after another, polled to the end; every third cancelled at once.
    Each job's creation and start (the server's timestamps) go to ``soak.job_times``."""
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
        status, last = "unfinished", created.json()
        while time.monotonic() < grace:
            await asyncio.sleep(0.25)
            polled = await timed(
                client,
                soak.healthy["job_poll"],
                HEALTHY_EXPECTED["job_poll"],
                "GET",
                url=f"/v1/upgrades/{job}",
            )
            if polled is None or not polled.is_success:
                continue
            last = polled.json()
            if last["status"] in TERMINAL:
                status = last["status"]
                break
        soak.jobs[status] += 1
        created_at, started_at = soak.mono(last["created_at"]), soak.mono(last["started_at"])
        soak.job_times.append((created_at, started_at, last["status"]))


async def wedge_database(proxy: FreezableProxy, starts: Sequence[float], soak: Soak) -> None:
    """Freeze the proxy in front of PostgreSQL at each of ``starts`` (monotonic) for
    ``--wedge-s`` seconds; each (freeze, thaw) goes to ``soak.windows``."""
    for start in starts:
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        proxy.freeze()
        frozen = time.monotonic()
        try:
            await asyncio.sleep(soak.args.wedge_s)
        finally:
            proxy.thaw()
            soak.windows.append((frozen, time.monotonic()))


def wedge_starts(args: argparse.Namespace) -> list[float]:
    """Seconds into the load of each wedge: the first a tenth of the way in, the last ending
    (with its grace) RECOVERY_S before the load does, the rest evenly between."""
    if args.wedges == 0:
        return []
    first = max(2.0, 0.1 * args.duration)
    last = args.duration - RECOVERY_S - WEDGE_GRACE_S - args.wedge_s
    if last < first:
        raise SystemExit(
            f"--duration {args.duration:g} s is too short for a wedge of {args.wedge_s:g} s "
            f"(starting at {first:g} s, {WEDGE_GRACE_S:g} s of grace and {RECOVERY_S:g} s to "
            "recover after it)"
        )
    if args.wedges == 1:
        return [first]
    step = (last - first) / (args.wedges - 1)
    if step < args.wedge_s + WEDGE_GRACE_S:
        raise SystemExit(
            f"{args.wedges} wedges of {args.wedge_s:g} s overlap in {args.duration:g} s"
        )
    return [first + i * step for i in range(args.wedges)]


async def run_load(
    service: RunningService,
    tenants: list[Tenant],
    keys: dict,
    mallory: str,
    flood: dict[str, Any],
    soak: Soak,
    proxy: FreezableProxy | None,
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
    flooder = client(keys["mallory-flood"])
    guesser = client("unused", HOSTILE_ADDRESS)
    guesser.headers.pop("Authorization")
    tic = time.monotonic()
    soak.wall0, soak.mono0 = time.time(), tic
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
        job_flood(flooder, flood, soak.flood_jobs, soak.hostile["job_flood"], until, FLOOD_RETRY_S),
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
    if proxy is not None:
        tasks.append(wedge_database(proxy, [tic + t for t in wedge_starts(args)], soak))
    # Sampled until the last request ends (a streamed search may outlast the load's deadline).
    sampler = asyncio.create_task(sample_rss(service.process.pid, soak.rss, until + 600))
    try:
        await asyncio.gather(*tasks)
    finally:
        sampler.cancel()
        for http in [*healthy, streamer, content, flooder, guesser]:
            await http.aclose()
    return time.monotonic() - tic


def end_flood(service: RunningService, key: str, jobs: Sequence[str]) -> dict[str, int]:
    """Cancel every job of the flood, then wait (up to a minute) for each to end: how many were
    running when the load ended, and how each ended."""
    headers = {"Authorization": f"Bearer {key}"}
    ended: Counter[str] = Counter()
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as client:
        before = Counter(client.get(f"/v1/upgrades/{job}").json()["status"] for job in jobs)
        for job in jobs:
            response = client.post(f"/v1/upgrades/{job}/cancel")
            if response.status_code not in (200, 409):
                raise RuntimeError(f"cancel {job}: {response.status_code} {response.text}")
        deadline = time.monotonic() + 60.0
        for job in jobs:
            status = "unfinished"
            while time.monotonic() < deadline:
                now = client.get(f"/v1/upgrades/{job}").json()["status"]
                if now in TERMINAL:
                    status = now
                    break
                time.sleep(0.2)
            ended[status] += 1
    return {
        "created": len(jobs),
        "running_at_end": before["running"],
        "queued_at_end": before["queued"],
        **{s: ended[s] for s in (*TERMINAL, "unfinished")},
    }


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
    """Lost acknowledged writes of every tenant (read back now), and each gallery's count beside
    the ids it may hold: the acknowledged ones, and those whose only writes got no clear answer
    (a 503 from a wedged database, or none) and were stored all the same."""
    lost, galleries = [], {}
    for tenant in tenants:
        headers = {"Authorization": f"Bearer {tenant.key}"}
        acked, unsettled = tenant.writes.acked, tenant.writes.unsettled
        maybe = sorted(set(unsettled) - set(acked))
        with httpx.Client(base_url=service.url, headers=headers, timeout=120) as client:
            stored = read_back(client, tenant.gallery, [*acked, *maybe])
            lost += lost_writes(acked, stored, unsettled)
            count = client.get(f"/v1/galleries/{tenant.gallery}").json()["count"]
        galleries[tenant.name] = {
            "count": count,
            "acked_ids": len(acked),
            "unsettled_ids": len(maybe),
            "unsettled_stored": sum(item in stored for item in maybe),
        }
    return lost, galleries


def server_5xx(service: RunningService) -> tuple[int, int]:
    """The server's own count of 5xx answers other than 503, and of 503s (/metrics)."""
    text = httpx.get(f"{service.url}/metrics", timeout=30).text
    pattern = re.compile(r'^nobackfill_http_requests_total\{.*status="(\d+)".*\} (\S+)$', re.M)
    counts = Counter[int]()
    for status, n in pattern.findall(text):
        counts[int(status)] += int(float(n))
    return sum(n for s, n in counts.items() if s >= 500 and s != 503), counts[503]


def rel(soak: Soak, moment: float | None) -> float | None:
    return None if moment is None else round(moment - soak.mono0, 3)


def run_phase(phase: str, args: argparse.Namespace, data: dict) -> dict[str, Any]:
    """One phase: a server of its own (SQLite, or PostgreSQL behind the freezable proxy), set up,
    loaded, checked live and after a restart; what it recorded and its checks."""
    soak = Soak(data["old"], args)
    workdir = Path(tempfile.mkdtemp(prefix=f"nobackfill-bench-soak-{phase}-"))
    data_dir = workdir / "data"
    env = dict(SERVER_ENV)
    proxy: FreezableProxy | None = None
    log = ""
    with phase_database(phase) as database_url:
        if database_url is not None:
            proxy = FreezableProxy(postgres_address(database_url))
            env.update(PG_ENV, NOBACKFILL_DATABASE_URL=through(database_url, proxy.port))
        service = start_service(data_dir, env, startup_timeout=120.0, cli_serve=True)
        try:
            keys = new_keys(data_dir, database_url)
            tenants = [Tenant("alpha", BENCH_KEY), Tenant("beta", keys["beta"])]
            for tenant in tenants:
                set_up_tenant(service, tenant, soak, data)
            mallory = Tenant("mallory", keys["mallory-content"])
            mallory.gallery = create_gallery(service, mallory, "mallory", soak.rows.shape[1])
            flooder = Tenant("mallory", keys["mallory-flood"])
            flood = flood_body(
                service, flooder.key, create_job_dataset(service, flooder, data, soak.rows.shape[1])
            )
            load_start = load_average()
            rss_start = rss_mib(service.process.pid) or 0.0
            seconds = asyncio.run(
                run_load(service, tenants, keys, mallory.gallery, flood, soak, proxy)
            )
            load_end = load_average()
            flood_end = end_flood(service, flooder.key, soak.flood_jobs)
            alive = service.process.poll() is None
            fives, fives_503 = server_5xx(service)
            lost_live, galleries = check_writes(service, [*tenants, mallory])
            service.stop()
            service = start_service(data_dir, env, startup_timeout=120.0, cli_serve=True)
            lost_restart, _ = check_writes(service, tenants)
        finally:
            service.stop()
            if proxy is not None:
                proxy.stop()
            if service.log_path.exists():
                log = service.log_path.read_text(errors="replace")
                if args.log_dir is not None:
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    shutil.copy(service.log_path, args.log_dir / f"soak-{phase}.log")
            shutil.rmtree(workdir, ignore_errors=True)
    windows, grace = soak.windows, WEDGE_GRACE_S if soak.windows else 0.0
    summary = lambda group, expected: {  # noqa: E731
        k: t.summary(expected[k], windows, grace, WEDGE_SLACK_S) for k, t in group.items()
    }
    wedges = None
    if proxy is not None:
        groups = {
            "upload": [e for k in ("upload_json", "upload_npy") for e in soak.healthy[k].events],
            "search": [e for k in ("search_json", "search_npy") for e in soak.healthy[k].events],
        }
        wedges = {
            "freeze_s": args.wedge_s,
            "grace_s": WEDGE_GRACE_S,
            "slack_s": WEDGE_SLACK_S,
            "windows": [[rel(soak, a), rel(soak, b)] for a, b in windows],
            "recoveries": recoveries(groups, windows, soak.mono0 + seconds),
        }
    run = {
        "database": "sqlite" if proxy is None else "postgresql",
        "server_env": {**env, "NOBACKFILL_DATABASE_URL": "(the proxy)"}
        if proxy is not None
        else env,
        "load_start": load_start,
        "load_end": load_end,
        "seconds": seconds,
        "duration": args.duration,
        "healthy": summary(soak.healthy, HEALTHY_EXPECTED),
        "hostile": summary(soak.hostile, HOSTILE_EXPECTED),
        "writes": {
            "acked_requests": sum(t.writes.acked_requests for t in tenants),
            "acked_ids": sum(len(t.writes.acked) for t in tenants),
            "lost_live": lost_live[:50],
            "lost_after_restart": lost_restart[:50],
            "galleries": galleries,
        },
        "jobs": {s: soak.jobs[s] for s in ("created", *TERMINAL, "unfinished")},
        "job_waits": job_waits(soak.job_times, windows, grace),
        "flood": {"method": flood["method"], "params": flood["params"], **flood_end},
        "wedges": wedges,
        "server": {
            "responses_5xx": fives,
            "responses_503": fives_503,
            "tracebacks": log_tracebacks(
                log, [(soak.wall(a), soak.wall(b)) for a, b in windows], grace
            ),
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
    run["checks"] = evaluate(run, args.p99_bound_ms, args.job_start_bound_s)
    run["ok"] = all(c["ok"] for c in run["checks"].values())
    return run


def first_run(out: Path, phases: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The run the job-start bound was set after: carried from the results file this run
    replaces when it names one, else this run (then the first)."""
    try:
        carried = json.loads(out.read_text()).get("job_start_first_run")
    except (OSError, ValueError):
        carried = None
    if carried:
        return carried
    return {
        "date": result["machine"]["date"],
        "command": result["command"],
        "bound_s": result["job_start_bound_s"],
        "max_s": {name: p["job_waits"]["max_s"] for name, p in phases.items()},
        "p50_s": {name: p["job_waits"]["p50_s"] for name, p in phases.items()},
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases, not published")
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}"
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds of load per phase")
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
        "--wedges", type=int, default=None, help="wedges of the database (postgresql phase)"
    )
    parser.add_argument("--wedge-s", type=float, default=WEDGE_S, help="seconds of each wedge")
    parser.add_argument(
        "--rss-headroom-mib",
        type=float,
        default=RSS_HEADROOM_MIB,
        help="server VmRSS bound: its value at the load's start + this",
    )
    parser.add_argument("--p99-bound-ms", type=float, default=P99_BOUND_MS)
    parser.add_argument("--job-start-bound-s", type=float, default=JOB_START_BOUND_S)
    parser.add_argument("--request-timeout", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="keep each phase's server log here"
    )
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or set(phases) - set(PHASES):
        parser.error(f"--phases: a comma-separated list of {', '.join(PHASES)}")
    args.duration = args.duration or (16.0 if args.quick else 45.0)
    args.wedges = args.wedges if args.wedges is not None else (1 if args.quick else 3)
    if args.seed_rows is None:
        args.seed_rows = 500 if args.quick else 2000
    if "postgresql" in phases:
        wedge_starts(args)  # refuses a schedule that does not fit before any server starts
    data = fixture_rows()
    load_start = load_average()
    tic = time.monotonic()
    runs = {phase: run_phase(phase, args, data) for phase in phases}
    out = args.out or (
        REPO_ROOT / ("bench/out/soak_quick.json" if args.quick else "bench/results/soak.json")
    )
    result: dict[str, Any] = {
        "command": command_line("bench.perf.soak", argv),
        "machine": machine_facts(),
        "load_start": load_start,
        "load_end": load_average(),
        "seconds": time.monotonic() - tic,
        "setup": {
            **{k: vars(args)[k] for k in ("duration", "batch", "pause", "seed_rows")},
            **{k: vars(args)[k] for k in ("stallers", "tricklers", "slowlorises")},
            "big_rows": BIG_ROWS,
            "big_k": BIG_K,
            "big_search_pause": args.big_search_pause,
            "streamed_interval_s": STREAMED_INTERVAL_S,
            "junk_claimed_bytes": JUNK_CLAIMED,
            "junk_sent_bytes": JUNK_SENT,
            "slowloris_interval_s": SLOWLORIS_INTERVAL_S,
            "flood_retry_s": FLOOD_RETRY_S,
            "wedges": args.wedges,
            "wedge_s": args.wedge_s,
            "dim": int(data["old"].shape[1]),
            "job_items": JOB_ITEMS,
            "hostile_address": HOSTILE_ADDRESS,
        },
        "p99_bound_ms": args.p99_bound_ms,
        "p99_bound_note": BOUND_NOTE if args.p99_bound_ms == P99_BOUND_MS else "",
        "job_start_bound_s": args.job_start_bound_s,
        "phases": runs,
        "ok": all(run["ok"] for run in runs.values()),
    }
    result["job_start_first_run"] = first_run(Path(out), runs, result)
    for phase, run in runs.items():
        for name, c in run["checks"].items():
            print(f"{phase} {name}: {'ok' if c['ok'] else 'FAILED'} — {c['detail']}")
    section = None if args.no_markdown or args.quick else SECTION
    publish(result, Path(out), render_markdown(result), section, TITLE)
    return result


if __name__ == "__main__":
    raise SystemExit(0 if main()["ok"] else 1)
