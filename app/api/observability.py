"""Liveness, readiness and Prometheus metrics: ``GET /healthz``, ``/readyz``, ``/metrics``.

Every app has its own ``CollectorRegistry`` (tests start many apps in one process; the global
registry would refuse the second app's metrics). Requests are counted by route *template*
(``/v1/galleries/{gallery_id}``), never by raw path, so ids do not multiply the series; a path
no route matches is counted as ``unmatched``. Stored quantities (jobs by state, vectors per
gallery) are read from the database at scrape time, so every API replica reports the same
totals. The three endpoints need no API key: probes and scrapers carry none. ``/metrics`` shows
gallery ids and counts, never names or vectors; keep it off the public network (the reverse
proxy or the scraper's network policy) where ids are confidential.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import redis
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field
from sqlalchemy import func, select, text
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import ServiceState, StateDep
from app.core.errors import Problem
from app.galleries.models import Gallery
from app.jobs.models import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, UpgradeJob

log = logging.getLogger(__name__)

UNMATCHED = "unmatched"
JOB_STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
# Seconds; uploads and training-free searches span milliseconds to tens of seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PROBE_TIMEOUT_S = 2.0


@dataclass
class Metrics:
    """One app's registry and its request metrics."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    auth_failures: Counter


class StoredCollector(Collector):
    """Gauges read from the database when Prometheus scrapes: upgrade jobs by state (all
    tenants) and vectors per gallery (``galleries.count``, kept by every upload and delete)."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "nobackfill_database_up", "1 when this scrape could read the database, else 0"
            ),
            GaugeMetricFamily(
                "nobackfill_upgrade_jobs", "Upgrade jobs by state, all tenants", labels=["state"]
            ),
            GaugeMetricFamily(
                "nobackfill_gallery_vectors", "Vectors stored per gallery", labels=["gallery_id"]
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterator[Metric]:
        up, jobs, vectors = self._families()
        state = getattr(self._app.state, "service", None)
        try:
            if state is None:
                raise RuntimeError("the service has not started")
            with state.db.sessions() as session:
                by_state = dict(
                    session.execute(
                        select(UpgradeJob.status, func.count()).group_by(UpgradeJob.status)
                    ).all()
                )
                galleries = session.execute(select(Gallery.id, Gallery.count)).all()
        except Exception as exc:  # a scrape reports the outage instead of failing
            log.warning("metrics: cannot read the database: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        for job_state in (*JOB_STATES, *sorted(set(by_state) - set(JOB_STATES))):
            jobs.add_metric([job_state], by_state.get(job_state, 0))
        for gallery_id, count in sorted(galleries):
            vectors.add_metric([gallery_id], count)
        yield from (up, jobs, vectors)


def make_metrics(app: FastAPI) -> Metrics:
    registry = CollectorRegistry()
    requests = Counter(
        "nobackfill_http_requests",
        "HTTP requests by method, route template and status code",
        ["method", "route", "status"],
        registry=registry,
    )
    latency = Histogram(
        "nobackfill_http_request_duration_seconds",
        "Time from the request's arrival to the end of its response, by route template",
        ["method", "route"],
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    auth_failures = Counter(
        "nobackfill_auth_failures",
        "Refused authentications: missing or unknown key, or throttled (too many failures)",
        ["reason"],
        registry=registry,
    )
    registry.register(StoredCollector(app))
    return Metrics(registry, requests, latency, auth_failures)


class RouteTemplates:
    """The path template of the route that served (or would have served) a request."""

    def __init__(self, app: FastAPI) -> None:
        self._app = app
        self._compiled: list[tuple[re.Pattern[str], str]] | None = None

    def _templates(self) -> list[tuple[re.Pattern[str], str]]:
        # The documented operations (included routers nest their routes), then the app's own
        # routes and mounts (docs, static assets); first match wins, as in routing.
        if self._compiled is None:
            compiled = [(compile_path(t)[0], t) for t in self._app.openapi().get("paths", {})]
            for route in self._app.routes:
                regex, template = (
                    getattr(route, "path_regex", None),
                    getattr(route, "path_format", None),
                )
                if regex is not None and isinstance(template, str):
                    compiled.append((regex, template))
            self._compiled = compiled
        return self._compiled

    def __call__(self, scope: Scope) -> str:
        path = getattr(scope.get("route"), "path", None)
        if isinstance(path, str):
            return path
        # Not routed: refused by a middleware first (413) or no route matched.
        for regex, template in self._templates():
            if regex.fullmatch(scope["path"]):
                return template
        return UNMATCHED


class RequestMetricsMiddleware:
    """Counts and times every HTTP request (outermost, so 413s from the body limit count too)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, templates: RouteTemplates) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets when the app raises before answering

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = self.templates(scope)
            method = scope["method"]
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)


class ReadyOut(BaseModel):
    status: str = Field(
        description="`ready`, or `read-only` while the data directory is full (searches are "
        "served, writes answer 507)"
    )
    checks: dict[str, str] = Field(
        description="each dependency checked: `ok`; `storage`: `ok` or `full: …` (what failed)"
    )


router = APIRouter(tags=["health"])


def _check_database(state: ServiceState) -> None:
    with state.db.engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def _check_redis(state: ServiceState) -> None:
    client = redis.Redis.from_url(
        state.settings.redis_url,
        socket_connect_timeout=PROBE_TIMEOUT_S,
        socket_timeout=PROBE_TIMEOUT_S,
    )
    try:
        client.ping()
    finally:
        client.close()


def _check_milvus(state: ServiceState) -> None:
    from app.vectors.milvus.storage import engine_for

    engine_for(state.settings).client.list_collections(timeout=PROBE_TIMEOUT_S)


@router.get("/healthz")
def health() -> dict[str, str]:
    """Liveness: the process serves requests. It touches no dependency: a database or broker
    outage is /readyz's to report (a restart would not cure it, so liveness must not fail)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=ReadyOut,
    responses={503: {"description": "a dependency does not answer; `detail` names it"}},
)
def ready(state: StateDep) -> dict:
    """Readiness: the database answers, with the Celery runner the Redis broker answers PING,
    and with the Milvus engine Milvus lists its collections. 503 names what failed; take the
    replica out of rotation until it passes.

    A full data directory is reported, not refused: `200` with `status: read-only` and
    `checks.storage` saying what failed. Such a replica still serves every search (from its
    indexes in memory), and its writes answer 507 whichever replica takes them (they share the
    volume), so taking it out of rotation would only add the searches to the outage. Alert on
    `status != ready`. The state clears once a probe write fits again (re-checked here and by
    the index flusher, at most every `STORAGE_RECHECK_S`)."""
    checks: dict[str, Callable[[ServiceState], None]] = {"database": _check_database}
    if state.settings.job_runner == "celery":
        checks["redis"] = _check_redis
    if state.settings.vector_engine == "milvus":
        checks["milvus"] = _check_milvus
    failed: dict[str, str] = {}
    for name, check in checks.items():
        try:
            check(state)
        except Exception as exc:  # any failure of a dependency means not ready
            failed[name] = f"{type(exc).__name__}: {exc}".strip()
    if failed:
        log.warning("not ready: %s", failed)
        detail = "; ".join(f"{name} does not answer ({reason})" for name, reason in failed.items())
        raise Problem(503, "Not ready", detail, slug="not-ready")
    out = {"status": "ready", "checks": dict.fromkeys(checks, "ok")}
    if state.storage is not None:
        storage = state.storage.recheck()
        out["checks"]["storage"] = f"full: {storage.detail}" if storage.full else "ok"
        if storage.full:
            out["status"] = "read-only"
    return out


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> Response:
    """Prometheus text exposition: requests by route template and status, latency histograms,
    upgrade jobs by state and vectors per gallery. No API key (scrapers carry none)."""
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def install_observability(app: FastAPI) -> None:
    """Add the request metrics middleware and the three endpoints. Call after every other
    middleware, so this one is outermost."""
    app.state.metrics = make_metrics(app)
    app.add_middleware(
        RequestMetricsMiddleware, metrics=app.state.metrics, templates=RouteTemplates(app)
    )
    app.include_router(router)
