"""Service settings: one ``BaseSettings`` read from ``NOBACKFILL_*`` variables (and ``.env``)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

JobRunnerName = Literal["thread", "inline", "celery"]
IndexKind = Literal["flat", "ivf", "hnsw"]


class Settings(BaseSettings):
    """Every knob of the service. Defaults are the embedded mode: SQLite under ``data_dir``,
    in-process thread runner, local FAISS, a local API key created on first start."""

    # An empty variable counts as unset (compose passes `${NOBACKFILL_BOOTSTRAP_KEY:-}` through).
    model_config = SettingsConfigDict(
        env_prefix="NOBACKFILL_", env_file=".env", extra="ignore", env_ignore_empty=True
    )

    # Storage.
    data_dir: Path = Path("data")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default sqlite:///<data_dir>/nobackfill.db"
    )
    auto_migrate: bool = Field(
        default=True, description="run `alembic upgrade head` when the API starts"
    )
    # A migration waits for the locks of the tables it changes: behind a session that holds one
    # (a long report, a stuck transaction) it would hold the start forever. Past these the start
    # fails, saying why, and the migration's transaction is rolled back whole.
    migration_lock_timeout_ms: int = Field(
        default=30_000,
        ge=0,
        description="PostgreSQL: how long a migration may wait for a lock held by another "
        "session before the migration (and the start) fails (0: no limit)",
    )
    migration_statement_timeout_ms: int = Field(
        default=900_000,
        ge=0,
        description="PostgreSQL: a migration statement running (or waiting) longer is cancelled "
        "and the migration (and the start) fails (0: no limit)",
    )
    sqlite_busy_timeout_ms: int = Field(default=30_000, ge=0)
    pg_statement_timeout_ms: int = Field(
        default=120_000,
        ge=0,
        description="PostgreSQL: a statement running longer is cancelled (0: no limit)",
    )
    pg_idle_in_transaction_timeout_ms: int = Field(
        default=60_000,
        ge=0,
        description="PostgreSQL: a session idle inside an open transaction this long is ended, "
        "so a stalled request cannot hold row locks or a connection (0: no limit)",
    )
    db_pool_size: int = Field(default=5, ge=1, description="pooled database connections")
    db_pool_overflow: int = Field(default=10, ge=0, description="connections beyond the pool")
    db_pool_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="how long a request waits for a pooled connection before answering 503",
    )
    db_connect_timeout_s: int = Field(
        default=5,
        ge=2,
        description="PostgreSQL: seconds to establish a connection (libpq connect_timeout; its "
        "minimum is 2) before the request answers 503",
    )
    db_ping_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="PostgreSQL: seconds the check of a pooled connection (SELECT 1 at "
        "checkout) may wait for an answer; past it the connection is dropped and a new one made",
    )
    db_read_timeout_s: float = Field(
        default=130.0,
        ge=0,
        description="PostgreSQL: seconds any statement, fetch or commit may wait for the server "
        "before the connection is closed and the request answers 503 (0: no limit). A wedged "
        "server answers nothing, so its statement_timeout cannot fire: keep this above "
        "pg_statement_timeout_ms",
    )
    storage_recheck_s: float = Field(
        default=10.0,
        gt=0,
        description="while the data directory is full, how often a probe write checks whether "
        "space is back (from /readyz and the index flusher)",
    )
    vector_storage: Literal["segments", "sql"] = Field(
        default="segments",
        description="where new galleries keep their vectors: append-only segment files under "
        "<data_dir>/vectors (manifest in the database) or one SQL row per vector",
    )
    vector_engine: Literal["faiss", "milvus"] = Field(
        default="faiss",
        description="what stores and searches new galleries: faiss (vectors as vector_storage "
        "says, an in-process FAISS index per gallery) or milvus (a collection per gallery)",
    )
    milvus_uri: str | None = Field(
        default=None,
        description="Milvus to use with vector_engine=milvus: a milvus-lite file path, or "
        "http(s)://host:19530 for a server; default <data_dir>/milvus.db (milvus-lite)",
    )
    milvus_token: str = Field(default="", description="Milvus token (user:password) for a server")
    qdrant_root: Path | None = Field(
        default=None,
        description="the only folder under which an attached Qdrant collection may name an "
        "embedded (local-mode) `path`; default <data_dir>/qdrant. A tenant must not make the "
        "server open arbitrary folders of its disk",
    )
    qdrant_api_key_env_prefix: str = Field(
        default="NOBACKFILL_QDRANT_KEY",
        min_length=1,
        description="an attached Qdrant collection's `api_key_env` must be this name or start "
        "with it (its value is sent to the tenant's URL: no other variable may be named)",
    )
    qdrant_allowed_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="the Qdrant servers an attached collection may name as `url`: each entry "
        "a URL prefix (scheme, host and port must match exactly, the path must start with the "
        "entry's). Empty (the default): no server URL at all, only embedded folders under "
        "qdrant_root: a tenant must not make the server connect to hosts of its choosing",
    )
    qdrant_timeout_s: float = Field(
        default=10.0, gt=0, description="timeout of one request to a Qdrant server"
    )
    milvus_attach_root: Path | None = Field(
        default=None,
        description="the only folder under which an attached Milvus collection may name a "
        "milvus-lite file as its `uri`; default <data_dir>/milvus-attach. A tenant must not make "
        "the server open arbitrary files of its disk",
    )
    milvus_token_env_prefix: str = Field(
        default="NOBACKFILL_MILVUS_TOKEN",
        min_length=1,
        description="an attached Milvus collection's `token_env` must be this name or start "
        "with it (its value is sent to the tenant's URL: no other variable may be named)",
    )
    milvus_allowed_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="the Milvus servers an attached collection may name as `uri`: URL prefixes, "
        "matched as qdrant_allowed_urls. Empty (the default): no server at all, only milvus-lite "
        "files under milvus_attach_root",
    )
    attach_shared_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Qdrant / Milvus servers (URL prefixes, matched as qdrant_allowed_urls) whose "
        "collections several tenants may attach. Elsewhere a collection on a server belongs to "
        "the first tenant that attached it, while it keeps a gallery on it: another tenant's "
        "attach of it answers 403. Embedded folders and files are always per tenant: "
        "<root>/<tenant folder>/, the tenant's name where it is a plain lower-case folder name, "
        "else its id",
    )
    milvus_attach_timeout_s: float = Field(
        default=10.0, gt=0, description="timeout of one request to an attached Milvus server"
    )
    pgvector_allowed_dsns: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="the PostgreSQL databases an attached pgvector table may name as `dsn`: "
        "each entry a DSN (`postgresql://host:port/db` or `host=/socket/dir port=5432 "
        "dbname=db`); a `dsn` matches an entry with the same host (or socket folder), port and "
        "database. Comma-separated or a JSON list. Empty (the default): no pgvector attach at "
        "all: a tenant must not make the server connect to databases of its choosing",
    )
    pgvector_password_env_prefix: str = Field(
        default="NOBACKFILL_PGVECTOR_PASSWORD",
        min_length=1,
        description="an attached pgvector table's `password_env` must be this name or start "
        "with it (its value is sent to the tenant's database: no other variable may be named)",
    )
    pgvector_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="connect and statement timeout of an attached pgvector table",
    )
    pgvector_idle_connections: int = Field(
        default=4,
        ge=0,
        le=64,
        description="read-only connections to one attached pgvector database kept open between "
        "searches, per API process (each is a backend on the owner's server, closed once idle "
        "for a minute); 0: a connection per request",
    )

    # Embedders and two-stage search (issue 43).
    embedder_allowed_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="the embedding endpoints a tenant may register (URL prefixes, matched as "
        "qdrant_allowed_urls). Empty (the default): none, so that no tenant can make the server "
        "call an address of its choosing",
    )
    embedder_api_key_env_prefix: str = Field(
        default="NOBACKFILL_EMBEDDER_KEY",
        min_length=1,
        description="an embedder's `api_key_env` must be this name or start with it (its value "
        "is sent to the tenant's URL: no other variable may be named)",
    )
    embedder_timeout_s: float = Field(
        default=10.0, gt=0, description="timeout of one call to an embedder"
    )
    embedder_max_batch: int = Field(
        default=256, ge=1, description="the largest `max_batch` an embedder may be registered with"
    )
    embedder_circuit_failures: int = Field(
        default=3, ge=1, description="consecutive failed calls that open an embedder's circuit"
    )
    embedder_circuit_open_s: float = Field(
        default=30.0, gt=0, description="seconds a circuit stays open (searches degrade at once)"
    )
    embed_items_per_minute: int = Field(
        default=20_000,
        ge=1,
        description="texts a tenant's searches may have embedded per minute (429 beyond)",
    )
    max_embedders_per_tenant: int = Field(default=20, ge=1)
    max_text_length: int = Field(
        default=8192, ge=1, description="characters of one document text stored with an item"
    )
    reembed_max_items_per_minute: int = Field(
        default=6_000,
        ge=1,
        description="the fastest a re-embed job may send texts to an embedder (items per "
        "minute; a job's `items_per_minute` may ask for less, not more)",
    )
    reembed_retries: int = Field(
        default=4,
        ge=0,
        description="retries of one failed embedder call in a re-embed job (backoff 1, 2, 4 … s) "
        "before the job fails; what it stored stays, and posting the job again resumes",
    )
    rerank_default_depth: int = Field(
        default=200,
        ge=1,
        description="candidates a two-stage search reranks when `rerank` names no depth; the "
        "default is the depth an upgrade's verdict judges (app.ml.upgrade.two_stage_curve)",
    )
    rerank_max_depth: int = Field(
        default=1000, ge=1, description="the largest `rerank.depth` a search may ask for"
    )
    rerank_max_candidates: int = Field(
        default=100_000,
        ge=1,
        description="queries × depth one two-stage search may rerank (422 beyond, before work)",
    )

    # HTTP.
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="addresses of the reverse proxies whose X-Forwarded-For names the client "
        "(comma list, or * for any). Empty (the default): the connection's own peer is the "
        "client, so no request can choose the address it is throttled by",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="request line and headers of one request at most (431 and the connection "
        "closed beyond; nobackfill serve)",
    )
    max_connections_per_address: int = Field(
        default=256,
        ge=0,
        description="connections one client address may hold open at once (429 and closed "
        "beyond; 0: no bound; the TRUSTED_PROXIES are exempt; nobackfill serve)",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="seconds a request's headers may take to arrive, from the connection's "
        "opening or the previous response (408 and the connection closed beyond)",
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    log_level: str = "info"

    # Auth.
    bootstrap_key: str | None = Field(
        default=None, min_length=16, description="API key of the local tenant (scripts, CI)"
    )
    local_key: bool = Field(
        default=True,
        description="create, store (<data_dir>/api_key) and print a local key when none is set",
    )
    local_tenant: str = "local"

    # Jobs.
    job_runner: JobRunnerName = "thread"
    job_threads: int = Field(default=1, ge=1, le=64)
    redis_url: str = "redis://127.0.0.1:6379/0"
    celery_queue: str = "nobackfill"
    # The API only publishes, without retries: a broker that is down, or accepts connections and
    # never answers (paused, overloaded, half-dead), must not hold POST /v1/upgrades; the job row
    # stays queued and the sweeper sends it later. Workers keep Celery's own reconnects.
    redis_connect_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=30,
        description="Redis (job_runner=celery): seconds the API waits to connect to the broker "
        "when it sends a job; past it the job stays queued for the sweeper",
    )
    redis_socket_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=30,
        description="Redis (job_runner=celery): seconds the API waits for the broker to answer "
        "a publish on an open connection (a wedged Redis); past it the connection is dropped "
        "and the job stays queued for the sweeper",
    )
    job_max_attempts: int = Field(default=3, ge=1, le=100)
    max_active_jobs_per_tenant: int = Field(
        default=4, ge=1, description="queued and running upgrades per tenant (429 above)"
    )
    # Fair queues (issue 45 item 5): a free slot goes to the tenant with the fewest running jobs
    # and the oldest last start. One running job per tenant by default: with one slot (the
    # embedded default, one GPU worker) it changes nothing; with more, a tenant flooding the
    # queue holds one slot and another tenant's job starts on the next free one at once. The
    # cap holds even when no one else waits: a server of one tenant with several slots raises it.
    max_running_jobs_per_tenant: int = Field(
        default=1, ge=1, description="jobs of one tenant running at once; the rest stay queued"
    )
    # Estimated as in app.upgrades.cost. Two upgrades at the largest epochs and batches per
    # epoch (1000 × 1000 on ≥ 2,000 training items, with the reference model: 2,000,000 steps
    # each) fit, a third waits: about 4 h at 3.6 ms a step, the cheapest step measured on 2 CPU
    # cores (12–37 ms for wider heads and batches; no GPU figure measured).
    max_queued_job_steps_per_tenant: int = Field(
        default=4_000_000,
        ge=1,
        description="estimated optimiser steps of one tenant's queued and running jobs (429 above)",
    )
    # 2 h, not 6: four jobs of one tenant could hold a slot for a day.
    job_max_seconds: float = Field(
        default=2 * 3600.0,
        gt=0,
        description="an upgrade running longer is stopped within one training step and fails",
    )
    job_max_epochs: int = Field(default=1000, ge=1, description="largest `epochs` of an upgrade")
    job_max_hidden_dim: int = Field(
        default=8192, ge=1, description="largest `hidden_dim` / `adapter_hidden` of an upgrade"
    )
    job_max_batches_per_epoch: int = Field(
        default=1000, ge=1, description="largest `min_batches_per_epoch` of an upgrade"
    )
    job_heartbeat_s: float = Field(default=10.0, gt=0)
    job_stale_after_s: float = Field(default=120.0, gt=0)
    job_sweep_interval_s: float = Field(default=30.0, gt=0)
    job_visibility_timeout_s: int = Field(default=6 * 3600, ge=60)

    # Limits (documented in the README; every one answers a clear 4xx when exceeded).
    max_request_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    body_idle_timeout_s: float = Field(
        default=15.0, gt=0, description="a request body silent this long is refused (408)"
    )
    body_timeout_s: float = Field(
        default=300.0, gt=0, description="a request body not complete after this is refused (408)"
    )
    auth_failure_limit: int = Field(
        default=20, ge=1, description="failed authentications per client address in the window"
    )
    auth_failure_window_s: float = Field(
        default=60.0, gt=0, description="the window of AUTH_FAILURE_LIMIT; past it, 429"
    )
    max_concurrent_uploads: int = Field(
        default=64,
        ge=1,
        description="requests with a body in progress at once (first byte to answer), in total; "
        "429 above",
    )
    max_concurrent_uploads_per_key: int = Field(
        default=8,
        ge=1,
        description="requests with a body in progress at once per API key; 429 above",
    )
    max_vectors_per_request: int = Field(default=10_000, ge=1)
    max_dim: int = Field(default=4096, ge=1)
    max_k: int = Field(default=1000, ge=1)
    max_hits_per_request: int = Field(
        default=200_000,
        ge=1,
        description="queries × k one search may ask for (422 before any work): 10,000 queries × "
        "k = 1,000 answered 931 MiB and took 8 GB of memory",
    )
    max_npz_answer_bytes: int = Field(
        default=2**30,
        ge=1024,
        description="bytes of one .npz search answer (413 once its projected size passes it, "
        "before the response starts): the answer is spooled to the data directory, so its disk "
        "is about twice this while the archive is written",
    )
    max_galleries_per_tenant: int = Field(default=100, ge=1)
    max_datasets_per_tenant: int = Field(default=100, ge=1)
    max_keys_per_tenant: int = Field(
        default=100, ge=1, description="active (unrevoked) API keys per tenant (403 above)"
    )
    max_page_size: int = Field(default=200, ge=1)
    max_id_length: int = Field(default=256, ge=1)

    # Index and search.
    default_index_kind: IndexKind = "flat"
    search_overfetch: int = Field(
        default=4, ge=1, description="FAISS candidates per requested neighbour before re-rank"
    )
    search_min_candidates: int = Field(default=64, ge=1)
    search_returned_tally: bool = Field(
        default=True,
        description="keep a per-item tally of what searches returned (1/rank per hit), a weak "
        "traffic signal the backfill plan may use; false: nothing is tallied",
    )
    search_returned_flush_s: float = Field(
        default=5.0,
        ge=0,
        description="write the returned tally to the database at most this often (0: on every "
        "search); a crash loses at most this long of it",
    )
    max_radius: float = Field(
        default=6.0,
        gt=0,
        description="largest hyperbolic radius of a stored point (float32 search degrades beyond)",
    )
    use_gpu: Literal["auto", "never"] = "auto"
    search_engine: Literal["auto", "torch", "faiss"] = Field(
        default="auto",
        description=(
            "exact scoring of flat galleries: auto (FAISS below 4 queries on a CPU, torch above),"
            " torch (matrix product) or faiss"
        ),
    )
    model_cache_size: int = Field(default=8, ge=1)
    index_flush_interval_s: float = Field(
        default=5.0,
        ge=0,
        description="write changed index files at most this often (0: on every write); the "
        "database is the truth and the startup check rebuilds a file a crash left stale",
    )

    @field_validator(
        "qdrant_allowed_urls",
        "milvus_allowed_urls",
        "attach_shared_urls",
        "pgvector_allowed_dsns",
        "embedder_allowed_urls",
        "trusted_proxies",
        mode="before",
    )
    @classmethod
    def _url_list(cls, value: object) -> object:
        """An environment variable holds `a,b` or a JSON list; both read as a list of URLs."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]

    @model_validator(mode="after")
    def _stale_after_heartbeat(self) -> Settings:
        if self.job_stale_after_s <= 2 * self.job_heartbeat_s:
            raise ValueError("job_stale_after_s must exceed twice job_heartbeat_s")
        return self

    @model_validator(mode="after")
    def _milvus_lite_in_one_process(self) -> Settings:
        # A milvus-lite file is opened by one process only: a Celery worker (another process)
        # could not read the galleries the API wrote. A Milvus server is shared by both.
        if self.vector_engine == "milvus" and self.job_runner == "celery" and self.milvus_lite:
            raise ValueError(
                "vector_engine=milvus with job_runner=celery needs a Milvus server "
                "(milvus_uri=http(s)://host:19530): a milvus-lite file is opened by one process "
                "only; use job_runner=thread with milvus-lite"
            )
        return self

    @property
    def milvus_lite(self) -> bool:
        """Whether the Milvus URI is an embedded milvus-lite file rather than a server."""
        return not self.resolved_milvus_uri.startswith(("http://", "https://", "tcp://", "grpc://"))

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'nobackfill.db').resolve()}"

    @property
    def resolved_milvus_uri(self) -> str:
        if self.milvus_uri:
            return self.milvus_uri
        return str((self.data_dir / "milvus.db").resolve())

    @property
    def resolved_qdrant_root(self) -> Path:
        return (self.qdrant_root or self.data_dir / "qdrant").resolve()

    @property
    def resolved_milvus_attach_root(self) -> Path:
        return (self.milvus_attach_root or self.data_dir / "milvus-attach").resolve()

    @property
    def artifact_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def index_dir(self) -> Path:
        return self.data_dir / "indexes"

    @property
    def local_key_file(self) -> Path:
        return self.data_dir / "api_key"

    @property
    def local_url_file(self) -> Path:
        """Where ``nobackfill serve`` records its URL, beside the key, for the CLI to find."""
        return self.data_dir / "server_url"


@lru_cache
def get_settings() -> Settings:
    return Settings()
