"""One phase of the soak (``bench.perf.soak``): its server started (SQLite, or PostgreSQL
behind the freezable proxy) and set up, loaded, then checked live and after a restart — the
flood's jobs cancelled, every acknowledged write read back, the server's 5xx counted — and
what it recorded summed up and judged (``bench.perf.soak_checks.evaluate``)."""

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
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common.fault_proxy import FreezableProxy
from bench.common.machine import load_average
from bench.common.service import BENCH_KEY, RunningService, start_service
from bench.perf.soak_checks import (
    HEALTHY_EXPECTED,
    HOSTILE_EXPECTED,
    evaluate,
    job_waits,
    log_tracebacks,
    lost_writes,
    recoveries,
)
from bench.perf.soak_clients import NPY
from bench.perf.soak_load import RSS_INTERVAL_S, TERMINAL, Soak, rss_mib, run_load
from bench.perf.soak_setup import (
    PG_ENV,
    SERVER_ENV,
    WEDGE_GRACE_S,
    WEDGE_SLACK_S,
    Tenant,
    create_gallery,
    create_job_dataset,
    flood_body,
    new_keys,
    phase_database,
    postgres_address,
    set_up_tenant,
    through,
)


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
                set_up_tenant(service, tenant, data, args)
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
