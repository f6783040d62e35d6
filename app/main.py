"""The FastAPI application: ``create_app(settings)``; everything stateful is built in the lifespan."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

import app.db_models  # noqa: F401  (the table registry: Database needs every mapped class)
from app.api.access import router as access_router
from app.api.body_guard import BodyGuardMiddleware
from app.api.datasets import router as datasets_router
from app.api.deps import ServiceState
from app.api.embedders import router as embedders_router
from app.api.galleries import router as galleries_router
from app.api.keys import router as keys_router
from app.api.models import router as models_router
from app.api.observability import install_observability
from app.api.reembed import router as reembed_router
from app.api.search import router as search_router
from app.api.upgrades import router as upgrades_router
from app.auth.service import ensure_local_key
from app.auth.throttle import AuthThrottle
from app.core.db import Database, migrate
from app.core.errors import install_error_handlers
from app.core.limits import BodyLimitMiddleware
from app.core.openapi import install_openapi
from app.core.security import display_prefix
from app.core.settings import Settings, get_settings
from app.core.storage import PROBE_BYTES, StorageHealth, available_bytes
from app.embedders.guard import EmbeddingGuards
from app.galleries.service import verify_all_indexes
from app.migration.returned import ReturnedTally
from app.models.service import ModelCache, remove_orphan_artifacts
from app.upgrades.runner import make_runner
from app.vectors.faiss.index_store import IndexStore

log = logging.getLogger("nobackfill")


def configure_logging(settings: Settings) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )


def build_state(settings: Settings) -> ServiceState:
    """Migrate, open the database, check every index against it, recover jobs."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.auto_migrate:
        migrate(settings.resolved_database_url, settings=settings)
    db = Database(settings)
    # A full disk does not stop the start: the startup check keeps what it could not write in
    # memory, searches are served, writes answer 507 and /readyz says so until space is back.
    storage = StorageHealth(settings.data_dir, recheck_s=settings.storage_recheck_s)
    store = IndexStore(
        settings.index_dir,
        use_gpu=settings.use_gpu == "auto",
        engine=settings.search_engine,
        flush_interval_s=settings.index_flush_interval_s,
        health=storage,
    )
    if settings.vector_engine == "milvus":
        from app.vectors.milvus.storage import hold_engine

        # Connect now: a Milvus that cannot be reached stops the start, not the first request.
        hold_engine(settings)
    with db.sessions() as session:
        outcome = verify_all_indexes(session, store)
        repaired = [g for g, result in outcome.items() if result != "ok"]
        log.info("startup check: %d indexes, %d rebuilt", len(outcome), len(repaired))
        remove_orphan_artifacts(session, settings)
    throttle = AuthThrottle(settings.auth_failure_limit, settings.auth_failure_window_s)
    returned = ReturnedTally(settings.search_returned_tally, settings.search_returned_flush_s)
    return ServiceState(
        settings,
        db,
        store,
        ModelCache(settings),
        make_runner(db, settings),
        throttle,
        returned,
        EmbeddingGuards.of(settings),
        storage,
    )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_logging(settings)
        try:
            state = build_state(settings)
        except Exception as exc:
            if available_bytes(settings.data_dir) >= PROBE_BYTES:
                raise
            # SQLite reads through its WAL index (a 32 KiB -shm file beside the database): on a
            # disk without a byte free it cannot make one, and says only "disk I/O error".
            raise RuntimeError(
                f"cannot start: the data directory {settings.data_dir} is full ({exc}); free "
                "some space (the service starts read-only on a nearly full disk)"
            ) from exc
        app.state.service = state
        local = ensure_local_key(state.db, settings)
        if local is not None and local.created:
            # Printed once, for the newcomer at the terminal; it is also in <data_dir>/api_key.
            print(f"API key: {local.key}", flush=True)
        elif local is not None:
            print(f"API key: {display_prefix(local.key)}… (from {local.source})", flush=True)
        state.runner.start(sweep=settings.job_runner != "inline")
        state.indexes.start()
        state.returned.start(state.db.sessions)
        try:
            yield
        finally:
            state.returned.stop()
            state.runner.stop()
            state.indexes.close()
            state.db.dispose()
            from app.vectors.qdrant.source import close_connections

            # An embedded Qdrant folder stays locked while its client is open.
            close_connections()
            attached_milvus = sys.modules.get("app.vectors.milvus.source")
            if attached_milvus is not None:
                # Loaded only where a Milvus collection was attached (pymilvus is optional).
                attached_milvus.close_connections()
            if settings.vector_engine == "milvus":
                from app.vectors.milvus.storage import release_engine

                release_engine(settings)

    # fastapi-offline serves Swagger UI (/docs) and ReDoc (/redoc) from assets in its wheel, so
    # the docs work without Internet access; validatorUrl None stops Swagger UI from sending the
    # document to swagger.io's online validator.
    app = FastAPIOffline(
        docs_url="/docs",
        redoc_url="/redoc",
        title="nobackfill",
        version="1",
        summary="Upgrade the embedding model behind a vector database without re-embedding it.",
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},
    )
    install_error_handlers(app)
    install_openapi(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    # Outside the size limit: a stalled or surplus body is refused before it is counted.
    app.add_middleware(
        BodyGuardMiddleware,
        idle_timeout_s=settings.body_idle_timeout_s,
        total_timeout_s=settings.body_timeout_s,
        max_uploads=settings.max_concurrent_uploads,
        max_uploads_per_key=settings.max_concurrent_uploads_per_key,
    )
    for router in (
        galleries_router,
        access_router,
        search_router,
        datasets_router,
        upgrades_router,
        models_router,
        embedders_router,
        reembed_router,
        keys_router,
    ):
        app.include_router(router)

    # Last: its middleware is then the outermost and sees every answer, the body limit's too.
    install_observability(app)
    return app
