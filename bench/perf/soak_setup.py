"""A soak phase's server and what it starts with (``bench.perf.soak``): the server's settings
(lowered timeouts; on PostgreSQL, database timeouts a wedge outlasts), its database, the keys
and tenants, their seeded galleries and paired datasets, and the flood's upgrade body."""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common.service import RunningService, npy_bytes
from bench.common.wordnet import NEW_MODEL, OLD_MODEL, REPO_ROOT
from bench.perf.load import noisy_rows
from bench.perf.soak_checks import WriteLog
from bench.perf.soak_clients import OCTET

FIXTURE = REPO_ROOT / "tests/fixtures/wordnet_small.npz"
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
# The flood: upgrades of this method with every parameter the server caps at its maximum.
FLOOD_METHOD, FLOOD_CAPPED = "l2", ("epochs", "min_batches_per_epoch", "hidden_dim")
# The synsets every upgrade trains on: their old and new gloss rows, paired.
JOB_ITEMS = 200


@dataclass
class Tenant:
    name: str
    key: str
    gallery: str = ""
    dataset: str = ""
    writes: WriteLog = field(default_factory=WriteLog)


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


def npy_parts(ids: Sequence[str], name: str, rows: np.ndarray) -> dict[str, Any]:
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
            files=npy_parts(job_ids, "vectors", data["job_old"]),
        )
        dataset = str(_post(client, "/v1/datasets", json={"name": "new", "gallery_id": jobs})["id"])
        _post(
            client,
            f"/v1/datasets/{dataset}/items",
            files=npy_parts(job_ids, "features", data["job_new"]),
        )
    return dataset


def set_up_tenant(
    service: RunningService, tenant: Tenant, data: dict, args: argparse.Namespace
) -> None:
    """A gallery seeded with ``--seed-rows`` rows drawn from ``data["old"]`` (acknowledged
    writes too), and a dataset of new-model features paired with a second gallery, for the
    upgrades."""
    dim = data["old"].shape[1]
    tenant.gallery = create_gallery(service, tenant, "soak", dim)
    headers = {"Authorization": f"Bearer {tenant.key}"}
    with httpx.Client(base_url=service.url, headers=headers, timeout=60) as client:
        rng = np.random.default_rng([args.seed, *tenant.name.encode()])
        ids = [f"{tenant.name}-seed-{i}" for i in range(args.seed_rows)]
        rows = noisy_rows(rng, data["old"], len(ids))
        url = f"/v1/galleries/{tenant.gallery}/vectors"
        for start in range(0, len(ids), 500):
            part = slice(start, start + 500)
            _post(client, url, files=npy_parts(ids[part], "vectors", rows[part]))
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
